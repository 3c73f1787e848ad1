"""A re-key through a relay that is SIGKILLed under it (issue 16, PROTOCOL §19).

The relay process (`engram-relay serve`, a real one) is killed the moment its database
shows the re-key at a chosen point: the new vault holding k blobs, or the old vault
retired; it is started again on the same port and database right after. Whatever the
re-key's own process then does (it may finish through its retries, or stop with an error),
every reader sees the vault wholly old (the old vault complete and not retired) or wholly
new (the new vault complete and the old retired), and `engram-sync rekey` run again
finishes with the same result. The client kills are in tests/e2e/test_rekey_cli.py;
`--full` runs the other fixed points and 20 random ones here (docs/rekey.md).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from engram_sync.shared_format.sync_keys import derive_sync_keys, vault_id_v2
from tests.e2e.test_rekey_cli import EXE, _decrypted, _fill, _retired
from tests.relay.conftest import Relay, base_config
from tests.reliability.support import RelayProcess

#: "new:k": the new vault holds k blobs (of 16; batches of 2); "retired": the old one is.
#: One point at CI size (mid-copy); the others with `--full` (tests/tiers.py).
CI_POINTS = (
    pytest.param("new:1", marks=pytest.mark.full),
    "new:9",
    pytest.param("retired", marks=pytest.mark.full),
)
BATCH = "2"


def _view(process: RelayProcess) -> Relay:
    """The helpers of test_rekey_cli take a Relay: the same URL and database."""
    return Relay(process.url, process.database_url, base_config(process.database_url))


def _rekey(vault: Path, home: Path, old: str, new: str) -> subprocess.Popen[str]:
    """`engram-sync rekey --json` of the vault at `vault`, started (old -> new passphrase)."""
    env = dict(os.environ, HOME=str(home), ENGRAM_REKEY_BATCH=BATCH,
               ENGRAM_PASSPHRASE=old, ENGRAM_NEW_PASSPHRASE=new)  # fmt: skip
    for name in ("ENGRAM_VAULT", "ENGRAM_NEW_API_KEY", "ENGRAM_REKEY_TEST_KILL"):
        env.pop(name, None)
    return subprocess.Popen(
        [EXE, "--vault", str(vault), "rekey", "--json"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _reached(relay: Relay, point: str, old_id: str, new_id: str) -> bool:
    if point == "retired":
        rows = relay.sql("SELECT retired_at IS NOT NULL AS r FROM vaults WHERE vault_id = $1",
                         old_id)  # fmt: skip
        return bool(rows and rows[0]["r"])
    wanted = int(point.split(":")[1])
    rows = relay.sql("SELECT count(*) AS n FROM blobs WHERE vault_id = $1", new_id)
    return int(rows[0]["n"]) >= wanted


def _kill_relay_at(
    process: RelayProcess, rekey: subprocess.Popen[str], point: str, old_id: str, new_id: str
) -> bool:
    """SIGKILL the relay once the database shows `point`, then start it again; True if the
    re-key was still running when the relay died."""
    relay = _view(process)
    deadline = time.monotonic() + 120
    while not _reached(relay, point, old_id, new_id):
        if rekey.poll() is not None and not _reached(relay, point, old_id, new_id):
            raise AssertionError(f"the re-key ended (rc {rekey.returncode}) before {point}")
        assert time.monotonic() < deadline, f"{point} never reached"
        time.sleep(0.002)
    running = rekey.poll() is None
    process.kill()
    process.start()  # same port, same database
    return running


def _killed_and_finished(tmp_path: Path, process: RelayProcess, point: str, old: str,
                         new: str) -> bool:  # fmt: skip
    relay = _view(process)
    alpha, old_id = _fill(tmp_path, relay, old)
    new_id = vault_id_v2(new)
    old_keys, new_keys = derive_sync_keys(old), derive_sync_keys(new)
    before = _decrypted(relay, old_id, old_keys)
    assert len(before) == 16

    rekey = _rekey(alpha, tmp_path, old, new)
    try:
        running = _kill_relay_at(process, rekey, point, old_id, new_id)
        _, stderr = rekey.communicate(timeout=300)
    finally:
        if rekey.poll() is None:
            rekey.kill()
    assert "Traceback" not in stderr, (point, stderr)
    if rekey.returncode != 0:
        assert stderr.strip().startswith("error:"), (point, stderr)  # one clear line

    # every reader sees the vault wholly old or wholly new
    if _retired(relay, old_id):
        assert _decrypted(relay, new_id, new_keys) == before, point
    else:
        assert _decrypted(relay, old_id, old_keys) == before, point
    if rekey.returncode != 0:  # else it finished through its retries
        again = _rekey(alpha, tmp_path, old, new)
        stdout, stderr = again.communicate(timeout=300)
        assert again.returncode == 0, (point, stderr)
        assert json.loads(stdout)["resumed"] is True, point
    assert _retired(relay, old_id), point
    assert _decrypted(relay, new_id, new_keys) == before, point
    assert _decrypted(relay, old_id, old_keys) == before, point  # the old vault kept as it was
    assert json.loads((alpha / "config.json").read_text())["sync"]["vault_id"] == new_id
    return running


@pytest.mark.parametrize("point", CI_POINTS)
def test_a_rekey_survives_the_relay_killed_under_it(
    tmp_path: Path, relay_process: RelayProcess, point: str
) -> None:
    running = _killed_and_finished(
        tmp_path, relay_process, point, "relay kill old passphrase", f"relay kill new {point}"
    )
    assert running, f"the re-key had ended before the relay was killed at {point}"


#: `--full`: this many re-keys with the relay killed at random points.
RANDOM_ROUNDS = 20


@pytest.mark.full
@pytest.mark.timeout(180 * RANDOM_ROUNDS)  # a round took up to ~50 s at load 9
def test_random_relay_kill_points(tmp_path: Path, relay_process: RelayProcess) -> None:
    rounds = RANDOM_ROUNDS
    rng = random.Random(int(os.environ.get("ENGRAM_REKEY_RANDOM_SEED", "16")))
    points = [f"new:{k}" for k in range(1, 17)] + ["retired"]
    running = 0
    for i in range(rounds):
        point = rng.choice(points)
        place = tmp_path / f"round{i}"
        place.mkdir()
        running += _killed_and_finished(
            place, relay_process, point, f"old passphrase {i}", f"new passphrase {i}"
        )
        print(f"round {i + 1}/{rounds}: relay killed at {point}, finished")  # with -s
    print(f"{running}/{rounds} kills while the re-key ran")
    assert running > 0

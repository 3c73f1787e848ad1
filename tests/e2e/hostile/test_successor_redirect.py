"""A relay that redirects a vault to another vault the account can open (issue 31, finding 1;
PROTOCOL §19 last bullet; docs/rekey.md "The successor statement").

Alice's account holds the keys of her personal vault P and of her team's vault T; Bob is a
member of T only. The relay says P was retired with T as its successor: a `retired` field on
P's pull page, a 410 `vault_retired` on P's push, or a real retire of P naming T by a key
that reaches both. Before the fix, `engram-sync sync` on Alice's device followed T by itself
and pushed her private memories into it, where Bob reads them. Now a device follows only a
successor whose statement verifies under P's own hmac key: every lie is refused with one
line naming both vault ids and the command to confirm, before any key is minted or any wrap
fetched for T, and T never holds a memory of P. The honest counterpart, a statement made with
P's key, is followed through the same machinery.
"""

from __future__ import annotations

import os
import pty
import secrets
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client._accounts import account
from engram_sync.client._flows.successor import (
    UnprovenSuccessorError,
    join_with_account,
    join_with_handoff,
)
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.shared_format.b64 import b64encode_std
from engram_sync.shared_format.successor_statement import make_statement
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange, rewrite_json
from tests.relay.conftest import ADMIN_KEY

EXE = str(Path(sys.executable).parent / "engram-sync")
PASSWORD = "alice's account password, long enough"
P_PASSPHRASE = "alice's private vault passphrase"
LAPTOP = "alice's laptop local passphrase"
AT = "2026-12-04T17:00:00.000000+00:00"
ERASE = "2099-01-01T00:00:00.000000+00:00"


@dataclass
class Alice:
    personal: str  # P
    team: str  # T
    device: DeviceHandle  # linked to P through her account (K from the wrap)
    hmac_p: bytes  # P's hmac key, which only holders of P's keys have
    private: list[str]  # memory ids of P
    bob: DeviceHandle  # a member of T only


def _setup(scene: Scene) -> Alice:
    token = secrets.token_hex(4)
    email, personal, team = f"alice-{token}@example.org", f"personal-{token}", scene.vault_id
    bob = scene.device("bob")  # T, the team vault
    add(bob, "team: the deploy runbook")
    bob.sync()
    seed = scene.blank_device("alice-seed", P_PASSPHRASE)  # P's first device, P's keys
    with seed.open() as session:
        session.link(scene.proxy.url, ADMIN_KEY, personal, "alice-seed")
        hmac_p = session.keys.hmac_key
    add(seed, "private: the first note")
    seed.sync()
    with seed.open() as session:
        account.signup(session.path, scene.proxy.url, email, PASSWORD)
        account.open_vault(session, PASSWORD)  # P's K wrapped in Alice's account
    seat = scene.device("alice-team")  # Alice is a member of T too
    with seat.open() as session:
        account.signin(session.path, scene.proxy.url, email, PASSWORD)
        account.open_vault(session, PASSWORD)  # T's K wrapped in Alice's account
    device = scene.blank_device("alice", LAPTOP)
    with device.open() as session:
        account.signin(session.path, scene.proxy.url, email, PASSWORD)
        account.link_with_account(session, scene.proxy.url, PASSWORD, personal, label="alice")
    private = [add(device, f"private: diary entry {i}") for i in range(3)]
    device.sync()
    private.append(add(device, "private: written offline"))  # pending: a push would carry it
    for handle in (device, seed, seat, bob):
        handle.restart()
    return Alice(personal, team, device, hmac_p, private, bob)


def _sync(alice: Alice, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        ENGRAM_PASSPHRASE=LAPTOP,
        ENGRAM_ACCOUNT_PASSWORD=PASSWORD,
        HOME=str(alice.device.path.parent / "home"),
    )
    for name in ("ENGRAM_VAULT", "ENGRAM_NEW_PASSPHRASE", "ENGRAM_NEW_API_KEY"):
        env.pop(name, None)
    return subprocess.run(
        [EXE, "--vault", str(alice.device.path), *(args or ("sync",))],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _sync_on_a_terminal(alice: Alice, answer: str) -> tuple[int, str]:
    """`sync` with stdin on a pseudo-terminal, answering the question with `answer`."""
    master, replica = pty.openpty()
    env = dict(
        os.environ,
        ENGRAM_PASSPHRASE=LAPTOP,
        ENGRAM_ACCOUNT_PASSWORD=PASSWORD,
        HOME=str(alice.device.path.parent / "home"),
    )
    with subprocess.Popen(
        [EXE, "--vault", str(alice.device.path), "sync"], env=env, stdin=replica,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as proc:  # fmt: skip
        os.close(replica)
        os.write(master, answer.encode() + b"\n")
        said, _ = proc.communicate(timeout=180)
    os.close(master)
    return proc.returncode, said


def _lie_on_pull(scene: Scene, old: str, said: dict[str, Any]) -> None:
    def retired(value: dict[str, Any]) -> None:
        value["retired"] = {"erase_after": ERASE, **said}

    scene.proxy.on("GET", rf"/v1/vaults/{old}/pull$", rewrite_json(retired))


def _lie_on_push(scene: Scene, old: str, said: dict[str, Any]) -> None:
    body = {"error": f"vault {old} was retired", "code": "vault_retired", **said}

    def gone(exchange: Exchange) -> Answer:
        return Answer(410, body)

    scene.proxy.on("POST", rf"/v1/vaults/{old}/push$", gone, forward=False)


def _memory_ids_of(scene: Scene, vault_id: str) -> set[str]:
    """Every memory id the real relay holds for the vault (read past the proxy)."""
    seen: set[str] = set()
    cursor = 0
    with RelayClient(scene.relay.url, ADMIN_KEY) as client:
        while True:
            page = client.pull(vault_id, cursor=cursor, limit=500)
            seen.update(blob.memory_id for blob in page.blobs)
            assert isinstance(page.cursor, int)
            cursor = page.cursor
            if not page.has_more:
                return seen


def _assert_refused(run: subprocess.CompletedProcess[str], alice: Alice) -> None:
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, run.stderr  # one line saying what to do
    line = errors[0]
    assert f"vault {alice.personal} was replaced by vault {alice.team}" in line
    assert f"`engram-sync rekey --join --successor {alice.team}`" in line


def test_a_relay_named_successor_without_a_statement_of_p_is_not_followed(
    scene: Scene,
) -> None:
    alice = _setup(scene)
    p, t = alice.personal, alice.team
    other_key = secrets.token_bytes(32)
    lies: list[tuple[Callable[[Scene, str, dict[str, Any]], None], dict[str, Any]]] = [
        (_lie_on_pull, {"successor": t}),  # no statement at all
        (_lie_on_push, {"successor": t}),
        (  # a wrong MAC
            _lie_on_pull,
            {"successor": t, "statement": b64encode_std(secrets.token_bytes(32)), "stated_at": AT},
        ),
        (  # a statement of P's key for another successor
            _lie_on_push,
            {
                "successor": t,
                "statement": make_statement(alice.hmac_p, p, "elsewhere", AT),
                "stated_at": AT,
            },
        ),
        (  # a statement replayed from another vault's re-key to T
            _lie_on_pull,
            {
                "successor": t,
                "statement": make_statement(other_key, "other-vault", t, AT),
                "stated_at": AT,
            },
        ),
        (  # P's statement for T moved to another time
            _lie_on_push,
            {
                "successor": t,
                "statement": make_statement(alice.hmac_p, p, t, AT),
                "stated_at": "2027-01-01T00:00:00.000000+00:00",
            },
        ),
    ]
    before = len(scene.proxy.log)
    for lie, said in lies:
        scene.proxy.honest()
        lie(scene, p, said)
        _assert_refused(_sync(alice), alice)
    scene.proxy.honest()
    # a real retire of P naming T, by a key that reaches both (the relay's own word)
    with scene.relay.client(ADMIN_KEY) as http:
        answer = http.post(f"/v1/vaults/{p}/retire", json={"successor": t})
    assert answer.status_code == 200, answer.text
    _assert_refused(_sync(alice), alice)
    code, said = _sync_on_a_terminal(alice, "n")  # a person on a terminal is asked
    assert code == 1, said
    assert f"warning: the relay says vault {p} was replaced by vault {t}" in said
    assert "Switch this device to it anyway?" in said
    assert "Traceback" not in said
    with alice.device.open() as session:  # the library checks it first too (not only the CLI)
        with pytest.raises(UnprovenSuccessorError, match=f"vault {p} was replaced by vault {t}"):
            join_with_account(session, PASSWORD)
        with pytest.raises(UnprovenSuccessorError):
            join_with_handoff(session)
    alice.device.restart()

    # nothing for T was minted or fetched by the account, nothing of P reached T
    asked = scene.proxy.log[before:]
    assert not [e for e in asked if e.path == "/account/keys"]
    assert not [e for e in asked if e.path.startswith(f"/account/vaults/{t}")]
    assert not [e for e in asked if e.path.startswith(f"/v1/vaults/{t}")]
    assert not set(alice.private) & _memory_ids_of(scene, t)
    alice.bob.sync()
    assert not [text for text in contents(alice.bob).values() if text.startswith("private")]
    with alice.device.open() as session:
        assert session.config.vault_id == p  # still P, its edit still pending for P
        assert session.state.rekeyed_from is None
    alice.device.restart()

    # the person's explicit word follows it (`rekey --join --successor T`)
    joined = _sync(alice, "rekey", "--join", "--successor", t)
    assert joined.returncode == 0, joined.stderr
    assert f"this device now syncs vault {t}" in joined.stdout


def test_a_successor_stated_with_p_s_key_is_followed_by_sync(scene: Scene) -> None:
    """The honest counterpart through the same machinery: the same lie of the relay, but
    with a statement made with P's hmac key, is followed by `sync` on its own."""
    alice = _setup(scene)
    p, t = alice.personal, alice.team
    statement = make_statement(alice.hmac_p, p, t, AT)
    _lie_on_pull(scene, p, {"successor": t, "statement": statement, "stated_at": AT})
    run = _sync(alice)
    assert run.returncode == 0, run.stderr
    assert f"this device now syncs its successor {t}" in run.stderr
    assert alice.private[-1] in _memory_ids_of(scene, t)  # followed, so pushed there

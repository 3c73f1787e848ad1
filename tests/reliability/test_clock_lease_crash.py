"""Clock leases survive a crash (issue 15; docs/live-sync.md "Clock leases").

A device process pushes memories one by one, handing its clocks out of a lease held in
memory, and is SIGKILLed right after; the restarted device's next push carries a clock above
every clock the relay holds from it (PROTOCOL §1/§8: no clock value is ever reused).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from engram_sync.client._session import VaultSession
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._vault import store as local_store
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.reliability.support import RelayProcess

PASSPHRASE = "clock lease passphrase"
VAULT = "clock-lease-vault"
PUSHES = 5

PUSHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from engram_sync.client._session import VaultSession
    from engram_sync.client._sync.reports import SyncReport
    from engram_sync.client._vault import store as local_store

    path, passphrase, pushes = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    with VaultSession.open(path, passphrase) as session, session.relay() as relay:
        syncer = session.syncer(relay)
        for n in range(pushes):
            local_store.add_memory(session.vault.conn, f"before the kill {n}")
            report = SyncReport()
            syncer.push(report)
            assert report.pushed == 1, report
        print("pushed", session.device.vector_clock, flush=True)
        time.sleep(600)  # SIGKILLed here: the rest of the lease is never written back
    """
)


def _clocks(relay: RelayProcess) -> list[int]:
    rows = Relay(relay.url, relay.database_url, None).sql(  # type: ignore[arg-type]
        "SELECT vector_clock FROM blobs WHERE vault_id = $1 ORDER BY seq", VAULT
    )
    return [int(r["vector_clock"]) for r in rows]


def test_a_device_killed_after_pushing_resumes_above_every_pushed_clock(
    relay_process: RelayProcess, tmp_path: Path
) -> None:
    vault = tmp_path / "device"
    with VaultSession.open(vault, PASSPHRASE, create=True) as session:
        session.link(relay_process.url, ADMIN_KEY, VAULT, "lease")
    proc = subprocess.Popen(
        [sys.executable, "-c", PUSHER, str(vault), PASSPHRASE, str(PUSHES)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("pushed"), line
    finally:
        proc.kill()  # SIGKILL
        proc.wait(timeout=60)
    before = _clocks(relay_process)
    assert len(before) == PUSHES
    assert before == sorted(set(before))  # increasing, each used once
    assert int(line.split()[1]) == max(before)  # handed out from one lease, in memory

    with VaultSession.open(vault, PASSPHRASE) as session, session.relay() as relay:
        local_store.add_memory(session.vault.conn, "after the restart")
        report = SyncReport()
        session.syncer(relay).push(report)
        assert report.pushed == 1
    after = _clocks(relay_process)
    assert len(after) == PUSHES + 1
    assert after[-1] > max(before)

"""PostgreSQL stopped and restarted under load (issue 6, issue 8 §7): the relay answers 503
with Retry-After during the outage, recovers by itself (no relay restart), and clients
that retry lose nothing."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engram_sync.client._errors import SyncError
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store as local_store
from engram_sync.relay.db.embedded import EmbeddedPostgres
from engram_sync.relay.db.migrate import upgrade_to_head
from tests.relay.conftest import ADMIN_KEY, free_port
from tests.reliability.support import RelayProcess

PASSPHRASE = "database faults passphrase"


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own on a fixed port, so it can be stopped and started."""
    base = Path(tempfile.mkdtemp(prefix="engram-dbfault-"))
    server = EmbeddedPostgres(base / "pg", port=free_port(), settings={"fsync": "off"})
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_relay_survives_a_database_restart_under_load(
    own_postgres: EmbeddedPostgres, tmp_path: Path
) -> None:
    upgrade_to_head(own_postgres.url)
    relay = RelayProcess(own_postgres.url)
    relay.start()
    try:
        vault = tmp_path / "device"
        with VaultSession.open(vault, PASSPHRASE, create=True) as session:
            session.link(relay.url, ADMIN_KEY, "faults", "device")
        written: list[str] = []
        stop = threading.Event()
        failures: list[str] = []

        def writer() -> None:
            with (
                VaultSession.open(vault, PASSPHRASE) as session,
                session.relay(
                    max_retries=3, backoff_base=0.1, backoff_max=0.5, timeout=5
                ) as client,
            ):
                syncer = session.syncer(client)
                while not stop.is_set():
                    with session.vault.transaction() as conn:
                        written.append(local_store.add_memory(conn, f"m{len(written)}"))
                    try:
                        syncer.sync()
                    except SyncError as exc:
                        failures.append(type(exc).__name__)
                        time.sleep(0.1)

        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(1.5)
        own_postgres.stop()
        outage: list[httpx.Response] = []
        # Down until the writer has felt it (its retries outlast a short outage), at least 2 s.
        deadline = time.monotonic() + 60
        while not failures or len(outage) < 10:
            assert time.monotonic() < deadline, "the writer never noticed the outage"
            outage.append(httpx.get(f"{relay.url}/ready", timeout=5))
            outage.append(
                httpx.get(
                    f"{relay.url}/v1/vaults/faults/stats",
                    headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                    timeout=5,
                )
            )
            time.sleep(0.2)
        health = httpx.get(f"{relay.url}/health", timeout=5)
        own_postgres.start()
        deadline = time.monotonic() + 60
        while httpx.get(f"{relay.url}/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the relay did not recover by itself"
            time.sleep(0.2)
        time.sleep(1.0)
        stop.set()
        thread.join(timeout=120)

        assert {r.status_code for r in outage} == {503}
        assert all(r.headers.get("retry-after") for r in outage)
        assert all(r.json()["code"] == "unavailable" for r in outage)
        assert health.status_code == 200  # liveness needs no database round trip
        assert failures, "the writer never noticed the outage: the test proved nothing"

        # a final sync after recovery pushes whatever the outage held back
        with VaultSession.open(vault, PASSPHRASE) as session, session.relay() as client:
            session.syncer(client).sync()
            assert local_store.count_to_push(session.vault.conn) == (0, 0)
        stats = httpx.get(
            f"{relay.url}/v1/vaults/faults/stats",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        ).json()
        assert stats["total_blobs"] == len(written)
    finally:
        relay.stop()

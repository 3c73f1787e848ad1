"""Two relay processes on one PostgreSQL serve one vault concurrently and stay correct
(issue 6): the per-vault lock and the sequence live in the database, not in a process.
Also issue 8 §3: many concurrent writers, several pullers, every accepted blob seen
exactly once by every puller."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from tests import tiers
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.relay.support import Sealer, wire
from tests.reliability.support import RelayProcess

FULL = tiers.full()  # --full: the full sizes (tests/tiers.py)
VAULT = "scale-out"


@pytest.fixture
def two_relays(fresh_database_url: str) -> Iterator[tuple[RelayProcess, RelayProcess]]:
    first, second = RelayProcess(fresh_database_url), RelayProcess(fresh_database_url)
    first.start()
    second.start()
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


def test_many_writers_two_relays_every_blob_seen_once(
    two_relays: tuple[RelayProcess, RelayProcess],
) -> None:
    writers, batches, per_batch = (50, 10, 20) if FULL else (50, 3, 10)
    relays = two_relays
    accepted: set[tuple[str, int]] = set()
    lock = threading.Lock()
    done = threading.Event()
    errors: list[BaseException] = []

    def write(index: int) -> None:
        sealer = Sealer(VAULT)
        relay = relays[index % 2]
        try:
            with httpx.Client(
                base_url=relay.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60
            ) as client:
                for b in range(batches):
                    blobs = [sealer.blob(f"w{index}-b{b}-m{m}", 1) for m in range(per_batch)]
                    response = client.post(
                        f"/v1/vaults/{VAULT}/push", json={"blobs": [wire(x) for x in blobs]}
                    )
                    response.raise_for_status()
                    assert response.json()["rejected"] == []
                    with lock:
                        accepted.update((x.memory_id, x.vector_clock) for x in blobs)
        except BaseException as exc:
            errors.append(exc)

    seen: list[list[tuple[str, int]]] = [[] for _ in range(4)]

    def pull(index: int) -> None:
        relay = relays[index % 2]
        cursor = 0
        try:
            with httpx.Client(
                base_url=relay.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60
            ) as client:
                while True:
                    finished = done.is_set()
                    page = client.get(
                        f"/v1/vaults/{VAULT}/pull", params={"cursor": cursor, "limit": 37}
                    ).json()
                    seen[index].extend((b["memory_id"], b["vector_clock"]) for b in page["blobs"])
                    cursor = page["cursor"]
                    if finished and not page["has_more"]:
                        return
        except BaseException as exc:
            errors.append(exc)

    pullers = [threading.Thread(target=pull, args=(i,)) for i in range(4)]
    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in pullers + threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    done.set()
    for t in pullers:
        t.join(timeout=300)
    assert not errors, errors[:3]
    assert len(accepted) == writers * batches * per_batch
    for index, got in enumerate(seen):
        assert len(got) == len(set(got)), f"puller {index} saw a blob twice"
        assert set(got) == accepted, f"puller {index} missed {len(accepted - set(got))} blobs"

    # one sequence for the vault across both processes: unique, gap-free, 1..N
    rows = Relay(relays[0].url, relays[0].database_url, None).sql(  # type: ignore[arg-type]
        "SELECT seq FROM blobs WHERE vault_id = $1 ORDER BY seq", VAULT
    )
    assert [r["seq"] for r in rows] == list(range(1, len(accepted) + 1))

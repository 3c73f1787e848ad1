"""The lockstep measurement of the relay against the ceiling (bench.lockstep) at a tiny size:
a real relay process, a real database. It checks the harness (the same blobs written on both
sides, batches and pages alternating, the untimed first read left out), never a speed."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench import ceiling, lockstep
from bench.corpus import Corpus
from bench.relay_load import headers, push_bodies
from bench.relay_process import RelayProcess

BLOBS, BATCH, PAGE, PASSES = 6, 2, 2, 2


def test_writes_and_reads_alternate_and_the_first_read_is_untimed(
    fresh_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = Corpus.make(BLOBS)
    key = "bench-" + secrets.token_urlsafe(24)
    steps: list[str] = []
    upsert, push = lockstep._timed_upsert, lockstep._timed_push
    c_page, r_page = lockstep._ceiling_page, lockstep._relay_page

    async def logged_upsert(*args: Any) -> float:
        steps.append("c")
        return await upsert(*args)

    def logged_push(*args: Any) -> float:
        steps.append("r")
        return push(*args)

    async def logged_c_page(*args: Any) -> tuple[float, int, int, bool]:
        steps.append("C")
        return await c_page(*args)

    def logged_r_page(*args: Any) -> tuple[float, int, int, bool]:
        steps.append("R")
        return r_page(*args)

    monkeypatch.setattr(lockstep, "_timed_upsert", logged_upsert)
    monkeypatch.setattr(lockstep, "_timed_push", logged_push)
    monkeypatch.setattr(lockstep, "_ceiling_page", logged_c_page)
    monkeypatch.setattr(lockstep, "_relay_page", logged_r_page)
    with (
        RelayProcess(fresh_database_url, key, tmp_path / "relay.log") as relay,
        asyncio.Runner() as loop,
        httpx.Client(base_url=relay.url, headers=headers(key, "bench-device")) as http,
    ):
        conn = loop.run(ceiling.connect(fresh_database_url))
        try:
            prepared = ceiling.prepare(corpus, "ceiling-t", count=BLOBS, batch=BATCH)
            bodies = push_bodies(corpus, "push-t", count=BLOBS, batch=BATCH)
            wrote = lockstep.write(loop, conn, prepared, http, "push-t", bodies)
            read = lockstep.read(loop, conn, "ceiling-t", http, "push-t", page=PAGE,
                                 passes=PASSES)  # fmt: skip
            stored = loop.run(conn.fetch(
                "SELECT vault_id, count(*) AS n FROM blobs GROUP BY vault_id ORDER BY vault_id"
            ))  # fmt: skip
            seq = loop.run(conn.fetchval("SELECT seq FROM vaults WHERE vault_id = 'ceiling-t'"))
        finally:
            loop.run(conn.close())
    assert [(r["vault_id"], r["n"]) for r in stored] == [("ceiling-t", BLOBS), ("push-t", BLOBS)]
    assert seq == BLOBS  # the ceiling's vault row left as the relay would
    assert wrote.ceiling_items == wrote.relay_items == BLOBS
    # Batch by batch, the side going first alternating.
    assert "".join(steps[: 2 * BLOBS // BATCH]) == "crrccr"
    assert wrote.ceiling_s > 0
    assert wrote.relay_s > 0
    # One untimed read and PASSES timed ones of each vault, page by page alternating.
    assert read.ceiling_items == read.relay_items == BLOBS * PASSES
    pages = "".join(steps[2 * BLOBS // BATCH :])
    assert pages == "CRRCCR" * (PASSES + 1)
    assert read.ceiling_s > 0
    assert read.relay_s > 0

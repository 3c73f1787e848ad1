"""The relay RSS measurement of `bench.pull_memory` at a tiny size: a real relay process,
a real database, three 1 MiB blobs, a page byte cap of one blob (so a full pull is three
pages). It checks the harness (every pull got every blob, the RSS figures, the target's
verdict), never a size or a speed."""

from __future__ import annotations

import asyncio
import math
import secrets
from pathlib import Path

import pytest

from bench import ceiling, pull_memory
from bench.monitor import ResourceMonitor
from bench.relay_process import RelayProcess
from bench.targets import PULL_RSS_LIMIT_MB, pull_memory_target

BLOBS = 3


def test_concurrent_full_pulls_of_1_mib_blobs_are_measured(
    fresh_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGRAM_RELAY_MAX_PAGE_BYTES", "1")  # one blob per page
    key = "bench-" + secrets.token_urlsafe(24)
    with RelayProcess(fresh_database_url, key, tmp_path / "relay.log") as relay:
        monitor = ResourceMonitor(relay.pid, None).start()
        try:
            with asyncio.Runner() as loop:
                conn = loop.run(ceiling.connect(fresh_database_url))
                try:
                    section = pull_memory.measure(
                        loop, conn, monitor, relay.url, key, BLOBS, vault_id="tiny"
                    )
                    stored = loop.run(
                        conn.fetch(
                            "SELECT length(ciphertext) AS n FROM blobs WHERE vault_id = 'tiny'"
                        )
                    )
                finally:
                    loop.run(conn.close())
        finally:
            monitor.stop()
    assert [r["n"] for r in stored] == [pull_memory.BLOB_CHARS] * BLOBS
    assert section["blobs"] == section["blobs_per_pull"] == BLOBS
    assert section["concurrent_pulls"] == pull_memory.CONCURRENT_PULLS == 4
    assert section["max_page_bytes"] == 1
    # One blob a page, and the last page says there is no more (a full pull, every page).
    assert BLOBS <= section["pages_per_pull"] <= BLOBS + 1
    assert section["vault_base64_mib"] == BLOBS
    for name in ("rss_before_mb", "rss_peak_mb", "pull_seconds_max"):
        assert math.isfinite(section[name])
        assert section[name] > 0
    assert section["rss_peak_mb"] >= section["rss_before_mb"]
    assert "pull_memory" in monitor.phases

    target = pull_memory_target(section)
    assert target.name == "relay_rss_concurrent_full_pulls"
    assert target.limit == PULL_RSS_LIMIT_MB == 300
    assert target.value == section["rss_peak_mb"]
    assert target.passed == (section["rss_peak_mb"] <= 300)
    # A pull that missed blobs fails the target whatever the RSS.
    assert not pull_memory_target({**section, "blobs_per_pull": BLOBS - 1}).passed
    assert pull_memory_target({**section, "rss_peak_mb": 1.0}).passed
    assert not pull_memory_target({**section, "rss_peak_mb": 301.0}).passed

"""The report of `python -m bench --citus` (bench.citus_compare): `<stem>-citus.json` and
`<stem>-citus.md`, with the environment, the targets of issue 18 and every figure."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import push_groups
from bench.citus_compare import PLAIN_SETTINGS, measure
from bench.env import environment
from bench.report import _clean, _environment, _row, _summary_row, _table, _targets
from bench.settings import Settings
from bench.targets import citus_targets

NOTES = (
    "Both databases run on this machine at once, each with its own relay process (like "
    "`engram-relay serve`); within each repeat the plain figure is measured first, then "
    "Citus's, on the same data size, and the Citus / plain ratios are taken per repeat "
    "(time over time: 2.0 means Citus took twice as long).",
    "Citus: one coordinator and two workers on 127.0.0.1 (tests/citus_cluster.py), 8 "
    "shards, every vault-scoped table distributed by vault_id (deploy/SCALING.md §3). "
    "Plain: one embedded PostgreSQL of the same major version. Both with the cluster's "
    "settings (fsync, synchronous_commit and full_page_writes off): the ratio measures "
    "the cluster's planning, routing and hops, not a disk. On one machine the nodes share "
    "the cores, so Citus can only cost here; the figure to watch is that the factor stays "
    "constant.",
    "Incremental pull: 10 new blobs pushed over HTTP onto a vault written in SQL with the "
    "relay's own upsert, then pulled from the cursor before them (median of 25 pulls a "
    "repeat). Push groups: relay.store.push.push_group in process on an asyncpg pool, "
    "one new blob per vault, median of the rounds (bench.push_groups).",
)


def _figures(c: dict[str, Any]) -> list[str]:
    rows: list[str] = []
    words = {"plain": "plain PostgreSQL", "citus": "Citus"}
    for name in ("plain", "citus"):
        side = c[name]
        rows += [
            _summary_row(f"{words[name]}: push {c['blobs']:,} blobs, batches of {c['batch']}",
                         side["push_blobs_per_s"]),
            _summary_row(f"{words[name]}: full pull, pages of {c['page']:,}",
                         side["pull_blobs_per_s"]),
            _summary_row(f"{words[name]}: pull {c['new_blobs']} new blobs, vault of "
                         f"{c['small_vault_blobs']:,}", side["incremental_pull_small_ms"]),
            _summary_row(f"{words[name]}: pull {c['new_blobs']} new blobs, vault of "
                         f"{c['large_vault_blobs']:,}", side["incremental_pull_large_ms"]),
            _row(f"{words[name]}: large / small", "", side["incremental_pull_large_to_small"],
                 "", "x"),
        ]  # fmt: skip
        for point in side["push_groups"]["points"]:
            rows.append(_row(f"{words[name]}: push group of {point['vaults']} vaults", "",
                             point["push_group_ms"], "", "ms"))  # fmt: skip
    ratio = c["citus_to_plain"]
    rows += [
        _summary_row("Citus / plain: push time", ratio["push_time_ratios"]),
        _summary_row("Citus / plain: full pull time", ratio["pull_time_ratios"]),
        _row("Citus / plain: incremental pull, small vault", "",
             ratio["incremental_pull_small"], "", "x"),
    ]  # fmt: skip
    rows += [_row(f"Citus / plain: push group of {p['vaults']} vaults", "", p["ratio"], "", "x")
             for p in ratio["push_group"]]  # fmt: skip
    setup = c["setup"]
    rows += [_row(f"setup: {key}", "", value, "", "s") for key, value in setup.items()]
    return _table(("figure", "min", "median", "max", "unit"), rows)


def markdown(data: dict[str, Any], command: str) -> str:
    """The whole report as Markdown."""
    env = data["environment"]
    citus = data["sections"]["citus"]
    lines = [f"# Engram Sync benchmark, Citus against plain PostgreSQL: "
             f"{env['started_utc'][:10]}, {env['git_sha']}", "",
             f"Command: `{command}`", "", "## Environment", ""]  # fmt: skip
    lines += _environment(data)
    if not citus["available"]:
        return "\n".join([*lines, "## Citus", "", citus["note"], ""])
    lines += [f"Citus {citus['versions']['citus']}, PostgreSQL {citus['versions']['postgresql']}.",
              "", "## Targets", "", *_targets(data), "## Figures", "", *_figures(citus),
              "## Method", ""]  # fmt: skip
    lines += [f"- {note}" for note in NOTES]
    return "\n".join(lines) + "\n"


def write(data: dict[str, Any], out: Path, stem: str, command: str) -> tuple[Path, Path]:
    """Write `<stem>.json` and `<stem>.md` into `out`; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    public = {**data, "command": command}
    json_path = out / f"{stem}.json"
    md_path = out / f"{stem}.md"
    text = json.dumps(_clean(public), indent=2, sort_keys=True, allow_nan=False)
    json_path.write_text(text + "\n", encoding="utf-8")
    md_path.write_text(markdown(data, command), encoding="utf-8")
    return json_path, md_path


def run(settings: Settings, log: Callable[[str], None], command: str) -> Path:
    """Measure (bench.citus_compare), judge (bench.targets.citus_targets), write; returns
    the Markdown path."""
    started = time.perf_counter()
    env = environment(postgres_version="see below", postgres_where="embedded PostgreSQL and a "
                      "Citus cluster started for the run (temp dirs)",
                      durability=", ".join(f"{k}={v}" for k, v in PLAIN_SETTINGS.items()
                                           if k != "max_connections"))  # fmt: skip
    section = measure(
        n=settings.n,
        large=settings.large_vault,
        repeats=settings.repeats,
        group_rounds=push_groups.QUICK_ROUNDS if settings.quick else push_groups.ROUNDS,
        workers=settings.workers,
        log=log,
    )
    if section.get("available"):
        env["postgresql"] = (
            f"{section['versions']['postgresql']} (Citus {section['versions']['citus']})"
        )
    data: dict[str, Any] = {
        "schema": 1,
        "environment": env,
        "settings": settings.as_json(),
        "sections": {"citus": section},
        "targets": citus_targets(section),
        "total_s": time.perf_counter() - started,
        "load_average_1m_at_end": os.getloadavg()[0],
    }
    stem = f"{env['started_utc'][:10]}-{env['git_sha']}-citus" + (
        "-quick" if settings.quick else ""
    )
    _, md_path = write(data, settings.out, stem, command)
    for target in data["targets"]:
        log(f"{target['verdict']}  {target['name']}: {target['value']:.3g} "
            f"(target {target['target']})")  # fmt: skip
    if not section.get("available"):
        log(section["note"])
    return md_path

"""`python -m bench`: run every measurement and write the report."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from pathlib import Path

from bench import citus_report, database, plots, relay_rows, report, runner
from bench.settings import Settings
from bench.targets import judge

CITUS_N = 20_000  # blobs pushed and pulled on each database, and the large vault
CITUS_QUICK_N = 2_000
CITUS_QUICK_LARGE = 4_000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the relay and the client; writes a JSON and a Markdown report "
        "(and PNG plots when matplotlib is installed).",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: runs in seconds")
    parser.add_argument("--full", action="store_true", help="the full sizes (100,000 blobs, "
                        "20 s latency runs, 100,000 memories, every section at its full size; "
                        "47 min on 2 cores under load); the default fits in 15 min")  # fmt: skip
    parser.add_argument("--n", type=int, help="blobs for the throughput figures "
                        "(default 20000; 100000 with --full, 2000 with --quick)")  # fmt: skip
    parser.add_argument("--duration", type=float, help="seconds of each latency run "
                        "(default 5; 20 with --full, 2 with --quick)")  # fmt: skip
    parser.add_argument("--out", type=Path, help="report directory (default bench/results)")
    parser.add_argument("--repeats", type=int, help="repeats of each figure (default 5; 3 with "
                        "--full, 1 with --quick)")  # fmt: skip
    parser.add_argument("--large-vault", type=int, help="blobs of the large vault of the "
                        "pull-cost comparison (default 50000; 200000 with --full, 20000 with "
                        "--quick)")  # fmt: skip
    parser.add_argument("--memories", type=int, help="memories of the client end-to-end run "
                        "(default 10000; 100000 with --full, 1000 with --quick)")  # fmt: skip
    parser.add_argument("--workers", type=int, help="relay worker processes, like `engram-relay "
                        "serve --workers` (default: one per core, at most 8)")  # fmt: skip
    parser.add_argument("--pull-memory-blobs", type=int, help="1 MiB blobs of the vault the "
                        "concurrent full pulls of the relay RSS target read (default 100; "
                        "200 with --full, 24 with --quick)")  # fmt: skip
    parser.add_argument("--import-memories", type=int, help="memories of the JSONL import "
                        "(default 10000; 100000 with --full, 2000 with --quick)")  # fmt: skip
    parser.add_argument("--relay", action="store_true", help="only the relay's rows (issue 36: "
                        "push and pull against the ceiling, p99 against the raw statement, idle "
                        "and pull RSS, the digest's push cost; --n default 20000, --repeats 5, "
                        "--duration 5, --pull-memory-blobs 200)")  # fmt: skip
    parser.add_argument("--citus", action="store_true", help="only push and pull on a Citus "
                        "cluster against one plain PostgreSQL (issue 18; --n default 20000, "
                        "--large-vault 20000; 2000 and 4000 with --quick)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; 0 when the report was written (whatever the verdicts), else 1."""
    args = _parser().parse_args(argv)
    if args.citus:  # bench.citus_compare's own sizes
        args.n = args.n or (CITUS_QUICK_N if args.quick else CITUS_N)
        args.large_vault = args.large_vault or (CITUS_QUICK_LARGE if args.quick else CITUS_N)
    if args.relay:  # bench.relay_rows's own sizes: >= 5 interleaved repeats
        args.n = args.n or 20_000
        args.repeats = args.repeats or 5
        args.duration = args.duration or 5.0
        args.pull_memory_blobs = args.pull_memory_blobs or 200  # as before the default tier
    try:
        settings = Settings.build(
            quick=args.quick,
            full=args.full,
            n=args.n,
            duration=args.duration,
            repeats=args.repeats,
            large_vault=args.large_vault,
            memories=args.memories,
            out=args.out,
            workers=args.workers,
            pull_memory_blobs=args.pull_memory_blobs,
            import_memories=args.import_memories,
        )
    except ValueError as exc:
        print(f"python -m bench: {exc}", file=sys.stderr)
        return 2
    if args.quick:
        database.warm_wal(0)  # its figures are not judged: no warm-up WAL (bench.database)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    command = "python -m bench " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.relay:
        data = relay_rows.execute(settings, log)
        env = data["environment"]
        stem = f"{env['started_utc'][:10]}-{env['git_sha']}-relay"
        md_path = relay_rows.write(data, settings.out, stem, command.strip())
        for target in data["targets"]:
            log(f"{target['verdict']}  {target['name']}: {report.fmt(target['value'])} "
                f"(target {target['target']}; {target['detail']})")  # fmt: skip
        log(f"report: {md_path}")
        return 0
    if args.citus:
        md_path = citus_report.run(settings, log, command.strip())
        log(f"report: {md_path}")
        return 0
    data = runner.execute(settings, log)
    data["targets"] = judge(data["sections"], data["corpus"])
    env = data["environment"]  # the commit and date the run started at
    tier = "-quick" if settings.quick else "-full" if settings.full else ""
    stem = f"{env['started_utc'][:10]}-{env['git_sha']}{tier}"
    settings.out.mkdir(parents=True, exist_ok=True)
    pngs, note = plots.write_plots(data, data["latencies_ms"], settings.out, stem)
    json_path, md_path = report.write(data, settings.out, stem, command.strip(), pngs, note)
    for target in data["targets"]:
        log(f"{target['verdict']}  {target['name']}: {report.fmt(target['value'])} "
            f"(target {target['target']})")  # fmt: skip
    log(f"report: {md_path} and {json_path.name}" + (f"; plots {note}" if note else ""))
    return 0

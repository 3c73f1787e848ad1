"""The run's report: `<stem>.json` (every figure) and `<stem>.md` (tables for people)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

NOTES = (
    "Each figure is measured `repeats` times; tables show min / median / max and every "
    "verdict uses the median. The relay/ceiling ratios are taken per repeat (the relay "
    "figure over the ceiling figure measured just before it, on the same data size).",
    "Ceiling = raw asyncpg on the same database and the relay's own tables and indexes "
    "(separate vault ids), running the relay's own statements: its unnest blob upsert "
    "(`relay.store.push.BLOB_UPSERT`) in batches of 500, each its own commit, and its "
    "cursor query (`relay.store.sync.PULL_PAGE`) in pages of 1,000. Its arrays are built "
    "before the clock starts.",
    "Relay push/pull = the same blobs over real HTTP (httpx, bodies encoded with msgspec "
    "before the clock starts, pulls decoded into `PullResponse`), one request after the "
    "other like one device; the relay runs in its own process(es), served like "
    "`engram-relay serve --workers N` (N in the environment table; production defaults "
    "otherwise: a pool of 10 and one push lane per worker, no access log).",
    "Blobs are real `BlobCipher.seal` outputs of PROTOCOL §4 plaintexts (about 600 "
    "ciphertext bytes, about 800 base64 characters), each with a real HMAC for its vault.",
    "Latency: closed loop, every device sends its next single-blob push as soon as the "
    "last one is answered (no think time), after one unmeasured warm-up push per device; "
    "an error is any non-200 answer, transport error or rejected blob. In a closed loop "
    "the median latency is about devices / throughput (Little's law), so the 32-device "
    "figures measure the relay's throughput as much as its speed; the one-device run is "
    "the unloaded baseline. The latency client is a minimal HTTP/1.1 keep-alive client on "
    "asyncio streams, one connection per device (httpx's async client saturated a core "
    "of this machine in trials, and its queueing showed up as latency).",
    "Relay RSS under concurrent full pulls (8): a vault of 1 MiB blobs (1,048,576 base64 "
    "characters each, the largest a default relay takes; real AES-GCM ciphertexts) is "
    "written straight into the relay's tables, then 4 devices pull all of it at once by "
    "cursor, each page stopping at the relay's page byte cap; the figure is the relay's "
    "peak RSS (every worker process summed) while they do. It runs last, on the relay "
    "the other phases used.",
    "Client end to end: device B's figure is the whole `sync()` (pull, HMAC check, "
    "AES-GCM decryption, plaintext decoding, last-writer-wins and the SQLCipher writes); "
    "device A's is its whole `sync()` (an empty pull, reading rows, encryption, pushes). "
    "Sync key derivation (Argon2id) and opening the vault (its own Argon2id key) are "
    "timed separately. The profile comes from one more run under cProfile.",
    "CPU by phase = CPU seconds / wall seconds of that phase (1.0 = one core busy): the "
    "relay process, this process (the load generator, and the client in the end-to-end "
    "phase) and PostgreSQL (postmaster and backends, when the server is the run's own). "
    "Other processes = the rest of the machine's busy CPU in that phase: the machine "
    "is shared, and when others use it the figures of that phase drop with it. The "
    "figures are this run's, not a promise.",
)


def fmt(value: Any) -> str:
    """A number for a table: thousands separators, three significant digits below 100."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)


def _row(*cells: Any) -> str:
    return "| " + " | ".join(fmt(c) for c in cells) + " |"


def _summary_row(label: str, figure: dict[str, Any]) -> str:
    return _row(label, figure["min"], figure["median"], figure["max"], figure["unit"])


def _table(header: tuple[str, ...], rows: list[str]) -> list[str]:
    return [_row(*header), "|" + "---|" * len(header), *rows, ""]


def _environment(data: dict[str, Any]) -> list[str]:
    env = data["environment"]
    settings = data["settings"]
    packages = ", ".join(f"{k} {v}" for k, v in env["packages"].items())
    rows = [
        _row("CPU model", env["cpu_model"]),
        _row("cores", f"{env['cores']} ({env['usable_cores']} usable)"),
        _row(
            "load average (1 min) at start / end",
            f"{env['load_average_1m_at_start']:.2f} / {data['load_average_1m_at_end']:.2f}",
        ),
        _row("OS", env["os"]),
        _row("Python", env["python"]),
        _row("PostgreSQL", f"{env['postgresql']}: {env['postgresql_where']}"),
        _row("PostgreSQL durability", env["postgresql_durability"]),
        _row("git sha", env["git_sha"]),
        _row("dirty (uncommitted changes to tracked files)", env["git_dirty"]),
        _row("quick", settings["quick"]),
        _row("repeats", settings["repeats"]),
        _row("relay worker processes", settings.get("workers", 1)),
        _row("started (UTC)", env["started_utc"]),
        _row("run time", f"{data['total_s']:.0f} s"),
        _row("packages", packages),
    ]
    return _table(("", ""), rows)


def _figures(data: dict[str, Any]) -> list[str]:
    s = data["sections"]
    e2e = s["client_e2e"]
    size = s["pull_vs_size"]
    n = s["ceiling"]["blobs"]
    rows = [
        _summary_row(f"1. ceiling: raw upsert of {n:,} blobs, batches of 500",
                     s["ceiling"]["write_blobs_per_s"]),
        _summary_row(f"1. ceiling: raw page reads of {n:,} blobs, pages of 1,000",
                     s["ceiling"]["read_blobs_per_s"]),
        _summary_row(f"2. relay push of {n:,} blobs, batches of 500",
                     s["relay_push"]["blobs_per_s"]),
        _summary_row("2. relay push / ceiling write", s["relay_push"]["ratios"]),
        _summary_row(f"3. relay pull of {n:,} blobs, pages of 1,000",
                     s["relay_pull"]["blobs_per_s"]),
        _summary_row("3. relay pull / ceiling read", s["relay_pull"]["ratios"]),
        _summary_row(f"4. pull {size['new_blobs']} new blobs, vault of "
                     f"{size['small_vault_blobs']:,}", size["small_ms"]),
        _summary_row(f"4. pull {size['new_blobs']} new blobs, vault of "
                     f"{size['large_vault_blobs']:,}", size["large_ms"]),
        _row("4. large / small", "", size["ratio_large_to_small"], "", "x"),
    ]  # fmt: skip
    latency = s["latency"]
    for mode in ("single_device", "shared_vault", "vault_per_device"):
        figures = latency[mode]
        words = f"{figures['devices']} device{'s' if figures['devices'] > 1 else ''}"
        if mode != "single_device":
            words += ", " + mode.replace("_", " ")
        for key in ("p50_ms", "p99_ms", "max_ms", "errors", "pushes_per_s"):
            rows.append(_summary_row(f"5. {words}: {key}", figures[key]))
    m = e2e["memories"]
    rows += [
        _summary_row(f"6. add {m:,} memories on A (SQLCipher)", e2e["add_memories_per_s"]),
        _summary_row("6. A: encrypt + push (sync)", e2e["push_s"]),
        _summary_row("6. A: encrypt + push (sync)", e2e["push_memories_per_s"]),
        _summary_row("6. B: pull + verify + decrypt + apply (sync)", e2e["pull_s"]),
        _summary_row("6. B: pull + verify + decrypt + apply (sync)", e2e["pull_memories_per_s"]),
        _summary_row("6. sync key derivation, once per device (not in the above)",
                     e2e["key_derivation_s"]),
        _summary_row("6. vault create/open, once per device (not in the above)",
                     e2e["vault_open_s"]),
    ]  # fmt: skip
    mem = s["relay_memory"]
    rows += [
        _row("7. relay RSS at start", "", mem["rss_start_mb"], "", "MiB"),
        _row("7. relay RSS peak (under load)", "", mem["rss_peak_mb"], "", "MiB"),
        _row("7. relay RSS after the load", "", mem["rss_end_mb"], "", "MiB"),
    ]
    d = s["digest"]
    rows += [
        _summary_row(f"12. find 1 divergent memory in {d['vault_blobs']:,} blobs: round trips",
                     d["round_trips"]),
        _summary_row("12. find it: bytes on the wire, both directions", d["wire_bytes"]),
        _summary_row("12. find it: JSON bodies, both directions", d["json_bytes"]),
        _summary_row(f"12. push {d['push']['blobs']:,} blobs and replace them, with the digest",
                     d["push"]["with_s"]),
        _summary_row("12. the same, the push before the digest", d["push"]["before_s"]),
        _summary_row("12. with / before - 1, new memories", d["push"]["new_overhead"]),
        _summary_row("12. with / before - 1, replacements", d["push"]["replace_overhead"]),
        _row("12. push path hashing per blob (CPU, overlapped with the write)", "",
             d["python_us_per_blob"], "", "us"),
        _summary_row("12. push with the digest / before it - 1", d["push"]["overhead"]),
    ]  # fmt: skip
    pulls = s["pull_memory"]
    words = f"{pulls['concurrent_pulls']} concurrent full pulls of {pulls['blobs']} 1 MiB blobs"
    rows += [
        _row(f"8. relay RSS before {words}", "", pulls["rss_before_mb"], "", "MiB"),
        _row(f"8. relay RSS peak during {words}", "", pulls["rss_peak_mb"], "", "MiB"),
        _row("8. pages per full pull", "", pulls["pages_per_pull"], "", "pages"),
        _row("8. slowest full pull", "", pulls["pull_seconds_max"], "", "s"),
    ]
    imported = s["jsonl_import"]
    rows.append(_summary_row(f"11. import {imported['memories']:,} memories from JSONL "
                             f"(batches of {imported['batch']:,})",
                             imported["memories_per_s"]))  # fmt: skip
    feed = s["live_feed"]
    idle, wake = feed["idle"], feed["wake"]
    rows += [
        _row(f"13. relay RSS before {idle['subscribers']:,} idle event streams", "",
             idle["rss_before_mb"], "", "MiB"),
        _row(f"13. relay RSS with {idle['subscribers']:,} idle event streams", "",
             idle["rss_idle_mb"], "", "MiB"),
        _row("13. extra RSS per idle event stream", "", idle["extra_kib_per_subscriber"], "",
             "KiB"),
        _row(f"13. database transactions per idle event stream ({idle['idle_s']:g} s idle)",
             "", idle["db_queries_per_subscriber"], "", "transactions"),
        _row(f"13. push -> change hint, {wake['rounds']} pushes: p50", "", wake["p50_ms"], "",
             "ms"),
        _row("13. push -> change hint: p99", "", wake["p99_ms"], "", "ms"),
    ]  # fmt: skip
    rows += _live_rows(s["live_latency"], s["live_throughput"])
    rows += _agent_rows(s["agent"])
    return _table(("figure", "min", "median", "max", "unit"), rows)


def _live_rows(live: dict[str, Any], feed: dict[str, Any]) -> list[str]:
    """Issue 15: bench.live_latency and bench.live_throughput."""
    where = (
        f"{live['background_devices']:,} devices, {live['vaults']} vaults, "
        f"{live['background']['pushes_per_s']:.0f} pushes/s"
    )
    return [
        _row(f"14. A push -> applied on B ({where}), {live['samples']} memories: p50", "",
             live["applied_p50_ms"], "", "ms"),
        _row("14. A push -> applied on B: p99", "", live["applied_p99_ms"], "", "ms"),
        _row("14. A's push alone (to its answer): p50", "", live["push_p50_ms"], "", "ms"),
        _row("14. A push -> B's sync report: p50", "", live["report_p50_ms"], "", "ms"),
        _summary_row(f"15. push, feed on ({feed['blobs_per_round']:,} blobs a round)",
                     feed["on_blobs_per_s"]),
        _summary_row("15. push, feed off", feed["off_blobs_per_s"]),
        _summary_row("15. off / on - 1", feed["overheads"]),
    ]  # fmt: skip


def _targets(data: dict[str, Any]) -> list[str]:
    rows = [
        _row(t["description"], t["value"], t["target"] + (f" {t['detail']}" if t["detail"] else ""),
             f"**{t['verdict']}**")
        for t in data["targets"]
    ]  # fmt: skip
    return _table(("target", "median", "goal", "verdict"), rows)


def _cpu(data: dict[str, Any]) -> list[str]:
    rows = [
        _row(name, u["wall_s"], u["relay_cores"], u["loadgen_cores"], u["postgres_cores"],
             u["other_processes_cores"], u["relay_rss_peak_mb"])
        for name, u in data["sections"]["cpu"].items()
    ]  # fmt: skip
    header = ("phase", "wall s", "relay cores", "load generator cores", "PostgreSQL cores",
              "other processes cores", "relay peak RSS MiB")  # fmt: skip
    return _table(header, rows)


def _sweep(data: dict[str, Any]) -> list[str]:
    sweep = data["sections"]["sweep"]
    if sweep.get("skipped"):
        return ["(skipped)", ""]
    rows = [
        _row(p["size"], p["ceiling_write"], p["relay_push"], p["ceiling_read"], p["relay_pull"])
        for p in sweep["points"]
    ]
    head = [f"{sweep['blobs']:,} blobs per point, one pass (blobs/s):", ""]
    return head + _table(
        ("batch / page size", "ceiling write", "relay push", "ceiling read", "relay pull"), rows
    )


def _profile(data: dict[str, Any]) -> list[str]:
    prof = data["sections"]["client_e2e"]["profile"]
    out = [
        f"{prof['memories']:,} memories, {prof['note']}: push {prof['push_s_profiled']:.2f} s, "
        f"pull {prof['pull_s_profiled']:.2f} s under the profiler.",
        "",
    ]
    for side, title in (("push", "Device A, encrypt + push"), ("pull", "Device B, pull + apply")):
        for kind, words in (("cumulative", "top 15 by cumulative time"),
                            ("tottime", "top 10 by own time")):  # fmt: skip
            rows = [
                _row(f"`{r['function']}`", r["ncalls"], r["tottime_s"], r["cumtime_s"])
                for r in prof[f"{side}_top_{kind}"]
            ]
            out += [f"**{title}: {words}**", ""]
            out += _table(("function", "calls", "own s", "cumulative s"), rows)
    return out


def markdown(data: dict[str, Any], command: str, plots: list[str], plot_note: str | None) -> str:
    """The whole report as Markdown."""
    env = data["environment"]
    title = f"# Engram Sync benchmark: {env['started_utc'][:10]}, {env['git_sha']}"
    lines = [title, "", f"Command: `{command}`", "", "## Environment", ""]
    lines += _environment(data)
    lines += ["## Targets", "", *_targets(data)]
    lines += ["## Figures", "", *_figures(data)]
    lines += ["## CPU by phase", "", *_cpu(data)]
    lines += ["## Throughput against batch / page size", "", *_sweep(data)]
    lines += ["## Where the client's time goes (cProfile)", "", *_profile(data)]
    lines += ["## Peer E2EE sync server", "", data["sections"]["peer"]["note"], ""]
    lines += ["## Plots", ""]
    lines += [f"![{p}]({p})" for p in plots] or [plot_note or "none"]
    lines += ["", "## Method", ""] + [f"- {note}" for note in NOTES]
    corpus = data["corpus"]
    lines.append(
        f"- Corpus: {corpus['blobs']:,} distinct blobs, mean ciphertext "
        f"{corpus['mean_ciphertext_bytes']:.0f} bytes ({corpus['mean_ciphertext_base64_chars']:.0f}"
        f" base64 characters), sealed in {corpus['seal_s']:.1f} s before the run; padded to "
        f"PADMÉ lengths (PROTOCOL §16), which costs {corpus['padding_overhead']:.2%} of the "
        "stored ciphertext characters."
    )
    return "\n".join(lines) + "\n"


def _clean(value: Any) -> Any:
    """NaN and infinities become null: the JSON file stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write(
    data: dict[str, Any],
    out: Path,
    stem: str,
    command: str,
    plots: list[str],
    plot_note: str | None,
) -> tuple[Path, Path]:
    """Write `<stem>.json` and `<stem>.md` into `out`; returns both paths."""
    out.mkdir(parents=True, exist_ok=True)
    public = {k: v for k, v in data.items() if k != "latencies_ms"}
    public["command"] = command
    public["plots"] = plots
    public["plot_note"] = plot_note
    json_path = out / f"{stem}.json"
    md_path = out / f"{stem}.md"
    text = json.dumps(_clean(public), indent=2, sort_keys=True, allow_nan=False)
    json_path.write_text(text + "\n", encoding="utf-8")
    md_path.write_text(markdown(data, command, plots, plot_note), encoding="utf-8")
    return json_path, md_path


def _agent_rows(agent: dict[str, Any]) -> list[str]:
    """Figure 16 (issue 17, docs/agent.md): unlock once."""
    command = agent["command"]
    return [
        _summary_row(f"16. `{command}` with the key agent", agent["with_agent_ms"]),
        _summary_row(f"16. `{command}` without it (passphrase)", agent["without_agent_ms"]),
        _summary_row("16. interpreter start (`python -c pass`)", agent["python_startup_ms"]),
        _summary_row("16. interpreter start + the CLI's imports", agent["cli_import_ms"]),
        _summary_row(f"16. `{command}` with the key agent: CPU", agent["cpu_ms"]["with_agent"]),
        _summary_row(f"16. `{command}` without it: CPU", agent["cpu_ms"]["without_agent"]),
        _summary_row("16. interpreter start + the CLI's imports: CPU",
                     agent["cpu_ms"]["cli_import"]),
        _summary_row("16. SQLCipher keyed open (PBKDF2, VAULT §2): CPU",
                     agent["cpu_ms"]["vault_open"]),
    ]  # fmt: skip

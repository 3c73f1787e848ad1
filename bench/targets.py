"""The targets of issue 7, judged on the median over repeats. A FAIL is reported as is."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Literal

P99_LIMIT_MS: Final = 25.0
PUSH_CEILING_RATIO: Final = 0.7  # issue 36: relay push / raw upsert, medians of >= 5 repeats
PULL_CEILING_RATIO: Final = 0.6  # issue 36: relay pull / raw page read
P99_RAW_RATIO: Final = 3.0  # issue 36: a push's p99 at 32 devices / the raw statement's
IDLE_RSS_LIMIT_MB: Final = 100.0  # issue 36: each relay process at rest
PULL_RSS_LIMIT_MB: Final = 300.0  # issue 14 item 5: RSS under 4 concurrent full pulls
PADDING_OVERHEAD_LIMIT: Final = 0.03  # issue 16: PADMÉ padding's storage cost on the corpus
FIND_ROUND_TRIPS: Final = 3.0  # issue 16: one divergent memory found in <= 3 round trips
FIND_BYTES: Final = 16 * 1024.0  # and <= 16 KB transferred, both directions
DIGEST_PUSH_OVERHEAD: Final = 0.02  # push throughput with the digest within 2% of without
SCAN_FAIR_ANSWERED: Final = 0.95  # issue 31: bucket digests answered during a narrow flood
IMPORT_RATE_LIMIT: Final = 10_000.0  # issue 17: memories/s imported from JSONL
REKEY_SECONDS_LIMIT: Final = 60.0  # issue 16: 100,000 memories re-keyed (scaled to M)
REKEY_FULL_MEMORIES: Final = 100_000
REKEY_REFUSED_LIMIT: Final = 1.0  # issue 16: the old vault refusing this device's writes
AGENT_COMMAND_LIMIT_MS: Final = 50.0  # issue 17: a command with the key agent running
AGENT_JSON_ALL_LIMIT_MS: Final = 250.0  # issue 36: every memory of 5,000 as JSON, agent running
WAKE_P50_LIMIT_MS: Final = 15.0  # issue 15: push -> applied on the other device, p50
WAKE_P99_LIMIT_MS: Final = 75.0  # and p99 (here only the relay's part: push -> hint)
FEED_PUSH_OVERHEAD: Final = 0.03  # issue 15: push throughput with the feed within 3% of off
ONE_MEMORY_VS_API: Final = 3.0  # issue 36: one memory A -> B, client / relay API round trip
ONE_MEMORY_SIZE_RATIO: Final = 1.2  # and its cost, largest vault / smallest
CLIENT_PUSH_VS_API: Final = 0.5  # client push rate / relay API push rate, largest vault
CLIENT_PULL_VS_API: Final = 0.3  # client pull+apply rate / relay API pull rate


@dataclass(frozen=True)
class Target:
    """One target and how the run did against it."""

    name: str
    description: str
    value: float
    limit: float
    op: Literal[">=", "<="]
    extra_ok: bool = True  # a further condition (e.g. no errors)
    detail: str = ""

    @property
    def passed(self) -> bool:
        """Whether the target is met."""
        met = self.value >= self.limit if self.op == ">=" else self.value <= self.limit
        return met and self.extra_ok

    def as_json(self) -> dict[str, Any]:
        """The target for the report, with its PASS/FAIL verdict."""
        return {
            "name": self.name,
            "description": self.description,
            "value": self.value,
            "target": f"{self.op} {self.limit:g}",
            "verdict": "PASS" if self.passed else "FAIL",
            "detail": self.detail,
        }


def judge(sections: dict[str, Any], corpus: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target of the run with its verdict; each row measured in a section whose load
    the run recorded (`sections["load"]`, bench.runner) carries that load in its detail."""
    loads: dict[str, dict[str, float]] = sections.get("load", {})
    groups: list[tuple[str, list[Target]]] = [
        ("throughput", throughput_targets(sections)),
        ("pull_vs_size", [_pull_cost_target(sections["pull_vs_size"])]),
        ("latency", _latency_targets(sections)),
        ("pull_memory", [pull_memory_target(sections["pull_memory"])]),
        ("digest", digest_targets(sections["digest"])),
        ("corpus", [_padding_target(corpus)]),
        ("jsonl_import", [_import_target(sections["jsonl_import"])]),
        ("rekey", rekey_targets(sections["rekey"])),
        ("live_feed", live_feed_targets(sections["live_feed"])),
        ("live_latency", live_latency_targets(sections["live_latency"])),
        ("live_throughput", live_throughput_targets(sections["live_throughput"])),
        ("agent", [agent_target(sections["agent"])]),
        ("stream_hog", [stream_hog_target(sections["stream_hog"])]),
    ]
    if "relay_idle" in sections:  # issue 36
        groups.insert(3, ("relay_idle", [idle_rss_target(sections["relay_idle"])]))
    optional = (
        ("history", history_targets),  # issue 35 (bench.history)
        ("mcp", mcp_targets),  # issue 33 (bench.mcp)
        ("web_vault", web_vault_targets),  # issue 34 (bench.web_vault)
        ("web_serve", web_serve_targets),  # issue 34 slice 3 (bench.web_serve)
        ("agent_reads", agent_reads_targets),  # issue 36 (bench.agent_reads)
        ("client_sizes", client_size_targets),  # issue 36 (bench.client_e2e.measure_sizes)
    )
    groups += [(name, rows(sections[name])) for name, rows in optional if name in sections]
    return [
        replace(t, detail=loaded(t.detail, loads.get(name))).as_json()
        if "load " not in t.detail
        else t.as_json()
        for name, rows in groups
        for t in rows
    ]


def _pull_cost_target(size: dict[str, Any]) -> Target:
    return Target(
        "pull_cost_vs_vault_size",
        f"incremental pull time, {size['large_vault_blobs']}-blob vault / "
        f"{size['small_vault_blobs']}-blob vault",
        size["ratio_large_to_small"],
        2.0,
        "<=",
    )


def _latency_targets(sections: dict[str, Any]) -> list[Target]:
    latency = sections["latency"]
    targets = []
    for mode, words in (
        ("shared_vault", "one shared vault"),
        ("vault_per_device", "a vault per device"),
    ):
        figures = latency[mode]
        errors = figures["errors"]["max"]
        targets.append(
            Target(
                f"push_p99_{mode}",
                f"p99 of single-blob pushes, {latency['devices']} concurrent devices, {words} (ms)",
                figures["p99_ms"]["median"],
                P99_LIMIT_MS,
                "<=",
                extra_ok=errors == 0,
                detail="and no errors" if errors == 0 else f"{errors:g} errors in a repeat",
            )
        )
    if "raw_latency" in sections:  # issue 36
        targets += p99_ratio_targets(latency, sections["raw_latency"])
    return targets


def _padding_target(corpus: dict[str, Any]) -> Target:
    return Target(
        "padding_storage_overhead",
        "storage overhead of PADMÉ padding (PROTOCOL §16): corpus ciphertext characters "
        "padded / unpadded - 1",
        corpus["padding_overhead"],
        PADDING_OVERHEAD_LIMIT,
        "<=",
    )


def _import_target(imported: dict[str, Any]) -> Target:
    return Target(
        "jsonl_import_rate",
        f"memories/s of `engram-sync import` of {imported['memories']:,} memories from JSONL "
        "into a fresh SQLCipher vault",
        imported["memories_per_s"]["median"],
        IMPORT_RATE_LIMIT,
        ">=",
    )


def loaded(detail: str, load: dict[str, float] | None) -> str:
    """`detail` with the machine's 1-minute load average before and after the figure's
    measurement (issue 36: the machine may be shared; absolute rows are read with it)."""
    if not load:
        return detail
    where = f"load {load['before']:.1f} -> {load['after']:.1f}"
    return f"{detail}; {where}" if detail else where


def throughput_targets(sections: dict[str, Any]) -> list[Target]:
    """Issue 36: relay push and pull against the raw ceiling measured in the same run, in
    lockstep (bench.lockstep), the median of the per-repeat ratios."""
    push, pull = sections["relay_push"], sections["relay_pull"]
    load = sections.get("load", {}).get("throughput")
    return [
        Target("relay_push_vs_ceiling",
               f"relay push blobs/s / raw asyncpg upsert blobs/s, batch by batch in lockstep "
               f"(bench.lockstep), median of {len(push['ratios']['values'])} repeats of "
               f"{push['blobs']:,} blobs",
               push["ratio_to_ceiling"], PUSH_CEILING_RATIO, ">=",
               detail=loaded(f"repeats {', '.join(f'{v:.2f}' for v in push['ratios']['values'])}",
                             load)),
        Target("relay_pull_vs_ceiling",
               f"relay pull blobs/s / raw asyncpg page read blobs/s, page by page in lockstep, "
               f"both vaults read once before, median of {len(pull['ratios']['values'])} "
               f"repeats",
               pull["ratio_to_ceiling"], PULL_CEILING_RATIO, ">=",
               detail=loaded(f"repeats {', '.join(f'{v:.2f}' for v in pull['ratios']['values'])}",
                             load)),
    ]  # fmt: skip


def p99_ratio_targets(
    latency: dict[str, Any], raw: dict[str, Any], load: dict[str, float] | None = None
) -> list[Target]:
    """Issue 36: p99 of a single-blob push at 32 devices / the p99 of the raw upsert of one
    blob on 32 connections (bench.ceiling.concurrent_single_upserts), same run."""
    targets = []
    for mode, words in (("vault_per_device", "a vault per device"),
                        ("shared_vault", "one shared vault")):  # fmt: skip
        relay_p99 = latency[mode]["p99_ms"]["median"]
        errors = latency[mode]["errors"]["max"]
        targets.append(Target(
            f"push_p99_vs_raw_{mode}",
            f"p99 of single-blob pushes, {latency['devices']} devices, {words} / p99 of the raw"
            f" upsert on {raw['connections']} connections (medians over repeats)",
            relay_p99 / raw["p99_ms"]["median"], P99_RAW_RATIO, "<=",
            extra_ok=errors == 0,
            detail=loaded(f"{relay_p99:.1f} / {raw['p99_ms']['median']:.1f} ms"
                          + ("" if errors == 0 else f"; {errors:g} errors"), load),
        ))  # fmt: skip
    return targets


def idle_rss_target(idle: dict[str, Any], load: dict[str, float] | None = None) -> Target:
    """Issue 36: each relay process's RSS at rest, before any request but /ready (the largest
    of them; with `--workers` the total of the supervisor, the workers and the resource
    tracker is in the detail)."""
    processes = idle["processes"]
    largest = max(processes, key=lambda p: p["rss_mb"])
    return Target(
        "relay_idle_rss",
        f"RSS at rest of the largest relay process, {idle['workers']} worker(s) (MiB)",
        largest["rss_mb"],
        IDLE_RSS_LIMIT_MB,
        "<=",
        detail=loaded(
            f"{largest['role']}; all {len(processes)} processes "
            f"{sum(p['rss_mb'] for p in processes):.0f} MiB: "
            + ", ".join(f"{p['role']} {p['rss_mb']:.0f}" for p in processes),
            load,
        ),
    )


def stream_hog_target(hog: dict[str, Any]) -> Target:
    """Issue 31 finding 2 (bench.stream_hog): while one key tries to hold thousands of
    event streams, other devices' pushes and pulls, each on a new connection, all answered."""
    held = hog["hog"]
    return Target(
        "stream_hog_device_failures",
        f"failed pushes and pulls of {hog['devices']} devices over {hog['seconds']:g} s while "
        f"one key tries to hold {hog['hog_streams_tried']:,} event streams "
        f"(ENGRAM_RELAY_MAX_CONNECTIONS {hog['limits']['ENGRAM_RELAY_MAX_CONNECTIONS']})",
        hog["device_failures"],
        0,
        "<=",
        extra_ok=hog["device_requests"] > 0,
        detail=f"({hog['device_requests']:,} requests; the hog's attempts answered "
        f"{held['attempts_answered']})",
    )


def live_latency_targets(live: dict[str, Any]) -> list[Target]:
    """Issue 15: A's push start -> applied in B's vault through the real client's live sync
    (bench.live_latency), under the background of connected devices and pushes."""
    ok = live["errors"] == 0
    detail = "and no errors" if ok else f"{live['errors']} errors"
    where = (
        f"{live['samples']} memories, {live['background_devices']:,} connected devices over "
        f"{live['vaults']} vaults, {live['target_pushes_per_s']:g} pushes/s"
    )
    return [
        Target("live_sync_applied_p50",
               f"A's push start -> applied in B's vault (real client, event stream), p50 of "
               f"{where} (ms)", live["applied_p50_ms"], WAKE_P50_LIMIT_MS, "<=",
               extra_ok=ok, detail=detail),
        Target("live_sync_applied_p99", "A's push start -> applied in B's vault, p99 (ms)",
               live["applied_p99_ms"], WAKE_P99_LIMIT_MS, "<=", extra_ok=ok, detail=detail),
    ]  # fmt: skip


def live_throughput_targets(feed: dict[str, Any]) -> list[Target]:
    """Issue 15: push throughput with the live feed on within 3% of off, alternating rounds
    (bench.live_throughput), and push/ceiling still >= 0.5 with it on."""
    return [
        Target("live_feed_push_overhead",
               "push blobs/s with ENGRAM_RELAY_LIVE_FEED=off / on - 1 (median over "
               f"{feed['rounds']} alternating round pairs)",
               feed["overhead"], FEED_PUSH_OVERHEAD, "<="),
        Target("live_feed_push_vs_ceiling",
               "relay push blobs/s with the feed on / raw asyncpg upsert blobs/s (median of "
               "per-round ratios)", feed["on_ratio_to_ceiling"], 0.5, ">="),
    ]  # fmt: skip


def live_feed_targets(feed: dict[str, Any]) -> list[Target]:
    """Issue 15: idle event streams cost at most 200 MB per 10,000 (scaled to the count of
    a quick run) and no database query, and a push wakes a stream of its vault quickly
    (bench.live_feed)."""
    idle, wake = feed["idle"], feed["wake"]
    return [
        Target(
            "live_feed_idle_rss",
            f"extra relay RSS with {idle['subscribers']:,} idle event streams over "
            f"{idle['vaults']} vaults (MiB)",
            idle["extra_rss_mb"],
            idle["limit_mb"],
            "<=",
            detail=f"({idle['extra_kib_per_subscriber']:.1f} KiB a stream)",
        ),
        Target(
            "live_feed_idle_queries",
            f"relay database transactions per idle event stream over {idle['idle_s']:g} s "
            "(pg_stat_database, less the same window without streams)",
            idle["db_queries_per_subscriber"],
            idle["db_queries_limit_per_subscriber"],
            "<=",
            detail=f"({idle['db_transactions_idle']} transactions with the streams, "
            f"{idle['db_transactions_background']} without)",
        ),
        Target(
            "live_feed_wake_p50",
            f"push start -> `event: change` on a stream of the vault, p50 of "
            f"{wake['rounds']} pushes (ms; the relay's share of issue 15's 15 ms)",
            wake["p50_ms"],
            WAKE_P50_LIMIT_MS,
            "<=",
        ),
        Target(
            "live_feed_wake_p99",
            f"push start -> `event: change`, p99 of {wake['rounds']} pushes (ms)",
            wake["p99_ms"],
            WAKE_P99_LIMIT_MS,
            "<=",
        ),
    ]


def digest_targets(digest: dict[str, Any]) -> list[Target]:
    """Figure 12 (bench.anti_entropy, PROTOCOL §18): finding one divergent memory, and the
    push cost of keeping the digest."""
    blobs = f"{digest['vault_blobs']:,}"
    return [
        Target(
            "digest_find_round_trips",
            f"round trips to find one divergent memory in a vault of {blobs} blobs",
            digest["round_trips"]["median"],
            FIND_ROUND_TRIPS,
            "<=",
            extra_ok=digest["found"],
            detail="and found" if digest["found"] else "NOT found",
        ),
        Target(
            "digest_find_bytes",
            f"bytes on the wire to find it, both directions, headers included (vault of "
            f"{blobs} blobs)",
            digest["wire_bytes"]["median"],
            FIND_BYTES,
            "<=",
        ),
        Target(
            "digest_push_overhead",
            "push throughput with the digest kept against the push before it: seconds with"
            " / before - 1, median of rounds (new memories and their replacements, batches"
            " of 500 over HTTP, two relays on two databases); the digest checked",
            digest["push_overhead"],
            DIGEST_PUSH_OVERHEAD,
            "<=",
            extra_ok=digest["push_digest_kept"],
            detail="digest kept" if digest["push_digest_kept"] else "digest NOT as pushed",
        ),
        scan_fairness_target(digest["scan_fairness"]),
    ]


def scan_fairness_target(fair: dict[str, Any]) -> Target:
    """Issue 31 (bench.scan_fairness): a vault's bucket digests (its repair path) answered
    during another key's flood of concurrent narrowings of a large vault."""
    return Target(
        "digest_scan_fairness",
        f"share of a vault's {fair['victim_asks']} bucket digests answered 200 during "
        f"{fair['flooders']} concurrent narrowings of another key's {fair['flood_rows']:,}-row"
        " vault",
        fair["victim_answered"],
        SCAN_FAIR_ANSWERED,
        ">=",
        detail=f"(victim {fair['victim_statuses']}, flood {fair['flood_statuses']})",
    )


def scrub_recovery_target(d: dict[str, Any]) -> Target:
    """Issue 35 (bench.scrub_recovery): a blob row deleted by hand is back on the relay
    within one scrub interval plus one maintenance round plus one sync, no manual step."""
    return Target(
        "scrub_lost_row_back",
        f"seconds from one blob row deleted by hand ({d['memories']:,}-memory vault) to it "
        f"back on the relay: the scrub (interval {d['scrub_interval_s']} s, rounds every "
        f"{d['maintenance_interval_s']} s + {d['round_s']:.2f} s) then one sync",
        d["total_s"],
        d["limit_s"],
        "<=",
        extra_ok=d["back"] and d["noticed"],
        detail=f"noticed after {d['noticed_s']:.1f} s, one sync {d['sync_s']:.1f} s, "
        + ("back" if d["back"] else "NOT back"),
    )


def pull_memory_target(pulls: dict[str, Any], load: dict[str, float] | None = None) -> Target:
    """Relay RSS under concurrent full pulls of a vault of 1 MiB blobs (bench.pull_memory);
    every pull must also have got every blob."""
    return Target(
        "relay_rss_concurrent_full_pulls",
        f"relay RSS under {pulls['concurrent_pulls']} concurrent full pulls of "
        f"{pulls['blobs']} blobs of 1 MiB (MiB, peak)",
        pulls["rss_peak_mb"],
        PULL_RSS_LIMIT_MB,
        "<=",
        extra_ok=pulls["blobs_per_pull"] == pulls["blobs"],
        detail=loaded(
            f"({pulls['pages_per_pull']} pages of at most "
            f"{pulls['max_page_bytes'] / 1024 / 1024:g} MiB per pull, every blob)",
            load,
        ),
    )


def client_size_targets(d: dict[str, Any]) -> list[Target]:
    """Issue 36: a sync costs what changed, not what the vault holds; every ratio from one
    run (bench.client_e2e.measure_sizes)."""
    sizes = d["sizes"]
    large = sizes[-1]
    targets = [
        Target(
            f"one_memory_vs_api_{which}",
            f"one memory A -> B through the client library (A add + sync, B sync), "
            f"{s['memories']:,}-memory vault, / the relay API round trip (push, pull), medians",
            s["one_memory_vs_api"],
            ONE_MEMORY_VS_API,
            "<=",
            detail=f"({s['one_memory_client_ms']:.1f} against {s['one_memory_api_ms']:.1f} ms)",
        )
        for which, s in (("small", sizes[0]), ("large", large))
    ]
    targets += [
        Target(
            "one_memory_cost_large_vs_small",
            f"one memory A -> B through the client, {large['memories']:,}-memory vault / "
            f"{sizes[0]['memories']:,}-memory vault (medians)",
            d["one_memory_large_vs_small"],
            ONE_MEMORY_SIZE_RATIO,
            "<=",
        ),
        Target(
            "client_push_vs_api",
            f"client push memories/s / relay API push blobs/s, {large['memories']:,} memories",
            large["push_vs_api"],
            CLIENT_PUSH_VS_API,
            ">=",
            detail=f"({large['client_push_per_s']:,.0f} against {large['api_push_per_s']:,.0f}/s)",
        ),
        Target(
            "client_pull_apply_vs_api",
            f"client pull+apply memories/s / relay API pull blobs/s, {large['memories']:,} "
            "memories",
            large["pull_apply_vs_api"],
            CLIENT_PULL_VS_API,
            ">=",
            detail=f"({large['client_pull_apply_per_s']:,.0f} against "
            f"{large['api_pull_per_s']:,.0f}/s)",
        ),
    ]
    return targets


def agent_reads_targets(d: dict[str, Any]) -> list[Target]:
    """Issue 36: `list` and `search` with the key agent answer in <= 50 ms for a page of
    results and <= 0.25 s for every memory as JSON (bench.agent_reads)."""
    n = d["memories"]
    rows = (
        ("agent_search_page_ms", "search_page_json", "a page of `search --json` results",
         AGENT_COMMAND_LIMIT_MS),
        ("agent_list_json_ms", "list_json", "`list --json`", AGENT_JSON_ALL_LIMIT_MS),
        ("agent_search_all_json_ms", "search_all_json", "`search --json` finding every memory",
         AGENT_JSON_ALL_LIMIT_MS),
    )  # fmt: skip
    return [
        Target(
            name,
            f"wall ms of {words} as a subprocess, key agent running, {n:,}-memory vault",
            d[f"{key}_ms"]["median"],
            limit,
            "<=",
            detail=f"({d['output_bytes'][key]:,} bytes out; the interpreter's start alone "
            f"{d['python_startup_ms']['median']:.0f} ms)",
        )
        for name, key, words, limit in rows
    ]


def agent_target(agent: dict[str, Any]) -> Target:
    """Issue 17 (docs/agent.md): one command's wall time with the key agent holding the keys;
    the detail gives the same command without it and what any command pays before it runs."""
    return Target(
        "agent_command_ms",
        f"wall ms of `{agent['command']}` as a subprocess with the key agent running",
        agent["with_agent_ms"]["median"],
        AGENT_COMMAND_LIMIT_MS,
        "<=",
        detail=f"(without the agent {agent['without_agent_ms']['median']:.0f} ms; before any "
        f"command runs: the interpreter's start {agent['python_startup_ms']['median']:.0f} ms, "
        f"start + the CLI's imports {agent['cli_import_ms']['median']:.0f} ms)",
    )


def rekey_targets(rekey: dict[str, Any]) -> list[Target]:
    """Issue 16 (PROTOCOL §19, bench.rekey): M memories re-keyed, the one-time Argon2id
    derivations apart, and the window in which the old vault refuses this device's writes."""
    m = f"{rekey['memories']:,} memories ({rekey['tombstones']:,} of them tombstones)"
    return [
        Target(
            "rekey_seconds",
            f"seconds to re-key {m} (engram-sync rekey's code), Argon2id apart; client CPU "
            f"{rekey['client_cpu_s']:.1f} s",
            rekey["seconds_excluding_argon2"],
            REKEY_SECONDS_LIMIT * rekey["memories"] / REKEY_FULL_MEMORIES,
            "<=",
        ),
        Target(
            "rekey_write_refused",
            "seconds from the retire's answer to the device's switch to the new vault (its "
            "writes held back only then)",
            rekey["write_refused_s"] if rekey["write_refused_s"] is not None else float("inf"),
            REKEY_REFUSED_LIMIT,
            "<=",
        ),
    ]


CITUS_RATIO_LIMIT: Final = 3.0  # issue 18: Citus / plain time stays a constant factor (~2x)
FLAT_PULL_LIMIT: Final = 1.5  # issue 18: incremental pull, large vault / small, per database


def citus_targets(citus: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 18 (`python -m bench --citus`, bench.citus_compare): Citus costs a constant
    factor over one plain PostgreSQL on the same machine, and on both the incremental
    pull costs the same in a small vault and a large one. None when Citus was not built."""
    if not citus.get("available"):
        return []
    ratio = citus["citus_to_plain"]
    targets = [
        Target("citus_push_time_ratio",
               f"push time of {citus['blobs']:,} blobs in batches of {citus['batch']}, "
               "Citus / plain PostgreSQL (median of per-repeat ratios)",
               ratio["push_time"], CITUS_RATIO_LIMIT, "<="),
        Target("citus_pull_time_ratio",
               f"full pull time of {citus['blobs']:,} blobs, pages of {citus['page']:,}, "
               "Citus / plain PostgreSQL (median of per-repeat ratios)",
               ratio["pull_time"], CITUS_RATIO_LIMIT, "<="),
    ]  # fmt: skip
    for name in ("plain", "citus"):
        targets.append(
            Target(
                f"{name}_incremental_pull_flat",
                f"incremental pull of {citus['new_blobs']} new blobs on "
                f"{'Citus' if name == 'citus' else 'plain PostgreSQL'}, "
                f"{citus['large_vault_blobs']:,}-blob vault / "
                f"{citus['small_vault_blobs']:,}-blob vault",
                citus[name]["incremental_pull_large_to_small"],
                FLAT_PULL_LIMIT,
                "<=",
            )
        )
    return [t.as_json() for t in targets]


REVERT_LIMIT_S: Final = 10.0  # issue 35: one revert brings 10,000 deletions back everywhere
HISTORY_EDIT_LIMIT: Final = 1.10  # issue 35: a local edit with history / without
HISTORY_PULL_LIMIT: Final = 1.15  # issue 35: a pull+apply of new versions with / without


def history_targets(d: dict[str, Any]) -> list[Target]:
    """Issue 35 "Figures" (bench.history, docs/history.md): a revert by device on every
    watching device, what keeping history costs an edit and a pull, and its storage cap."""
    revert, edit, pull, cap = d["revert"], d["edit_overhead"], d["pull_overhead"], d["storage_cap"]
    back = revert["unrevertible"] == 0 and revert["undeleted"] == revert["memories"]
    within = cap["capped_bytes"] <= cap["cap_bytes"]
    counted = cap["capped_bytes"] == cap["capped_bytes_counted"]
    return [
        Target(
            "history_revert_10k",
            f"seconds from the start of `Vault.revert(device=A)` on B to all {revert['memories']:,}"
            f" memories A deleted held again by both watching devices "
            f"({', '.join(revert['watching_devices'])}; the revert, then B's sync)",
            revert["all_back_s"],
            REVERT_LIMIT_S,
            "<=",
            extra_ok=back,
            detail=f"revert {revert['revert_s']:.2f} s, sync {revert['sync_s']:.2f} s "
            f"(pushed {revert['pushed_by_revert']:,}); undeleted {revert['undeleted']:,}, "
            f"unrevertible {revert['unrevertible']}",
        ),
        Target(
            "history_edit_overhead",
            f"a local edit (its transaction) with history / without, median of "
            f"{edit['rounds']:,} interleaved pairs on a {edit['memories']:,}-memory vault",
            edit["ratio"],
            HISTORY_EDIT_LIMIT,
            "<=",
            detail=f"{edit['with_ms']:.3f} ms / {edit['without_ms']:.3f} ms; the work before "
            f"COMMIT {edit['work_with_ms']:.3f} / {edit['work_without_ms']:.3f} ms = "
            f"{edit['work_ratio']:.2f}",
        ),
        Target(
            "history_pull_overhead",
            f"a sync pulling and applying {pull['memories']:,} new versions of held memories, "
            f"with history / without (`Syncer._keep_replaced` a no-op), median of "
            f"{pull['rounds']} alternating rounds",
            pull["ratio"],
            HISTORY_PULL_LIMIT,
            "<=",
            detail=f"{pull['with_s']:.2f} s / {pull['without_s']:.2f} s; the applies alone "
            f"{pull['apply_with_s']:.2f} / {pull['apply_without_s']:.2f} s = "
            f"{pull['apply_ratio']:.2f}",
        ),
        Target(
            "history_storage_cap",
            f"capped history bytes after {cap['edits']:,} edits of {cap['memories']:,} memories "
            f"/ the cap ({cap['max_percent']:g}% of the vault's {cap['vault_bytes']:,} bytes)",
            cap["capped_bytes"] / cap["cap_bytes"],
            1.0,
            "<=",
            extra_ok=within and counted,
            detail=f"{cap['capped_bytes']:,} of {cap['cap_bytes']:,} bytes, "
            f"{cap['history_rows']:,} rows, the edits took {cap['edits_s']:.1f} s"
            + ("" if counted else f"; NOT the rows' sum {cap['capped_bytes_counted']:,}"),
        ),
    ]


MCP_CROSS_P50_MS: Final = 50.0  # issue 33: remember on A -> recall on B finds it, p50
MCP_CROSS_P99_MS: Final = 250.0  # and p99
MCP_RECALL_P95_MS: Final = 20.0  # issue 33: recall on a 100,000-memory vault, p95
MCP_REMEMBER_RATE: Final = 500.0  # issue 33: remember calls per second through stdio


def mcp_targets(d: dict[str, Any]) -> list[Target]:
    """Issue 33 "Figures" (bench.mcp, docs/mcp.md): a memory crossing two devices through
    their MCP servers, recall on a large vault, remember throughput over stdio."""
    cross, recall, rate = d["remember_to_recall"], d["recall"], d["remember_throughput"]
    load = f"load {cross['load_average_1m']:.1f}"
    crossing = (
        f"ms from `remember` returning on A to `recall` on B finding it, {cross['memories']} "
        f"memories, two `engram-sync mcp` over stdio (live sync) through one relay"
    )
    return [
        Target(
            "mcp_remember_to_recall_p50",
            crossing + ", p50",
            cross["p50_ms"],
            MCP_CROSS_P50_MS,
            "<=",
            detail=f"p90 {cross['p90_ms']:.1f} ms, min {cross['min_ms']:.1f} ms; {load}",
        ),
        Target(
            "mcp_remember_to_recall_p99",
            crossing + ", p99",
            cross["p99_ms"],
            MCP_CROSS_P99_MS,
            "<=",
            detail=f"max {cross['max_ms']:.1f} ms; {cross['recalls_on_b']} recalls on B; {load}",
        ),
        Target(
            "mcp_recall_100k",
            f"ms per `recall` (a tool call in-process, limit 10) on a {recall['memories']:,}-"
            f"memory vault, p95 of {recall['recalls']:,} two-word queries",
            recall["p95_ms"],
            MCP_RECALL_P95_MS,
            "<=",
            detail=f"p50 {recall['p50_ms']:.1f} ms, p99 {recall['p99_ms']:.1f} ms, "
            f"{recall['mean_results']:.1f} results each; load {recall['load_average_1m']:.1f}",
        ),
        Target(
            "mcp_remember_throughput",
            f"`remember` calls per second through stdio ({rate['remembers']:,} calls, "
            f"{rate['in_flight']} in flight from one client, live sync on)",
            rate["memories_per_s"],
            MCP_REMEMBER_RATE,
            ">=",
            detail=f"one at a time {rate['one_at_a_time_per_s']:.0f}/s; "
            f"load {rate['load_average_1m']:.1f}",
        ),
    ]


WEB_UNLOCK_LIMIT_S: Final = 2.0  # issue 34: passphrase unlock to the memories shown
WEB_PULL_LIMIT_S: Final = 3.0  # issue 34: 10,000 memories pulled, verified, decrypted, listed
WEB_SEARCH_LIMIT_MS: Final = 50.0  # issue 34: a search over them
WEB_PASSKEY_LIMIT_S: Final = 0.3  # issue 34: passkey unlock after the gesture
WEB_LIVE_LIMIT_MS: Final = 200.0  # issue 34: a memory added on one side shown on the other


def web_vault_targets(d: dict[str, Any]) -> list[Target]:
    """Issue 34 "Figures" (bench.web_vault, docs/web-vault.md), in Chromium; none when the
    run had no browser (`skipped`)."""
    if "skipped" in d:
        return []
    unlock, pull, search = d["unlock"], d["pull"], d["search"]
    return [
        Target(
            "web_unlock",
            f"seconds from Unlock to the {unlock['memories']} memories listed in the page "
            "(two Argon2id derivations in Workers, register, pull, verify, decrypt, list)",
            unlock["unlock_s"],
            WEB_UNLOCK_LIMIT_S,
            "<=",
            detail=f"keys {unlock['keys_s']:.2f} s",
        ),
        Target(
            "web_pull_10k",
            f"seconds from the keys derived to {pull['memories']:,} memories listed in the page "
            "(every page pulled through the proxy and checked, every blob verified and "
            "decrypted, the list rendered)",
            pull["pull_s"],
            WEB_PULL_LIMIT_S,
            "<=",
            detail=f"pulled and decrypted {pull['pulled_s']:.2f} s, keys {pull['keys_s']:.2f} s",
        ),
        Target(
            "web_search_10k",
            f"milliseconds of a search over {search['memories']:,} memories in the page (search "
            f"and results rendered), median of {search['searches']} queries",
            search["median_ms"],
            WEB_SEARCH_LIMIT_MS,
            "<=",
            detail=f"first (builds the index) {search['first_ms']:.1f} ms, "
            f"max {search['max_ms']:.1f} ms",
        ),
        *web_passkey_targets(d),
        *(web_live_targets(d["live"]) if "live" in d else []),
    ]


def web_live_targets(live: dict[str, Any]) -> list[Target]:
    """Issue 34: a memory added in the page on a CLI device running watch, and the reverse
    (bench.web_live), p50 of `samples` adds each way."""
    return [
        Target(
            "web_live_to_cli",
            "milliseconds from a memory added in the page to it in a CLI device's vault "
            f"(Vault.watch on the relay's event stream), p50 of {live['samples']}",
            live["to_cli_p50_ms"],
            WEB_LIVE_LIMIT_MS,
            "<=",
            detail=f"max {live['to_cli_max_ms']:.0f} ms",
        ),
        Target(
            "web_live_from_cli",
            "milliseconds from a memory added on a CLI device (Vault.watch pushing) to it "
            f"listed in the open page (fetch event stream), p50 of {live['samples']}",
            live["from_cli_p50_ms"],
            WEB_LIVE_LIMIT_MS,
            "<=",
            detail=f"max {live['from_cli_max_ms']:.0f} ms",
        ),
    ]


def web_passkey_targets(d: dict[str, Any]) -> list[Target]:
    """Issue 34: passkey unlock after the gesture (bench.web_passkey); none in a run without it."""
    if "passkey" not in d:
        return []
    passkey = d["passkey"]
    return [
        Target(
            "web_passkey_unlock",
            f"seconds from the passkey's PRF output to the {passkey['memories']} memories listed "
            "(HKDF, the sealed session opened, the passkey wrap fetched and opened, a device key "
            "minted, register, pull, verify, decrypt, list)",
            passkey["after_gesture_s"],
            WEB_PASSKEY_LIMIT_S,
            "<=",
            detail=f"with the virtual authenticator's gesture {passkey['with_gesture_s']:.3f} s",
        ),
        *web_passkey_vault_targets(d),
    ]


def web_passkey_vault_targets(d: dict[str, Any]) -> list[Target]:
    """Issue 34: passkey unlock of a passphrase vault after the gesture (bench.web_passkey)."""
    if "passkey_vault" not in d:
        return []
    passkey = d["passkey_vault"]
    return [
        Target(
            "web_passkey_vault_unlock",
            f"seconds from the passkey's PRF output to the {passkey['memories']} memories of a "
            "passphrase vault listed (HKDF, the sealed API key opened, the vault's passkey wrap "
            "fetched and opened, register, pull, verify, decrypt, list)",
            passkey["after_gesture_s"],
            WEB_PASSKEY_LIMIT_S,
            "<=",
            detail=f"with the virtual authenticator's gesture {passkey['with_gesture_s']:.3f} s",
        )
    ]


WEB_SERVED_RATIO: Final = 3.0  # issue 34 slice 3: /vault/ p50 over /health p50 (ours)
WEB_VERIFY_LIMIT_S: Final = 2.0  # `engram-sync web verify` against a relay (ours)
WEB_PAGE_LIMIT_MS: Final = 1000.0  # /vault/ loaded and its modules run in Chromium (ours)


def web_serve_targets(d: dict[str, Any]) -> list[Target]:
    """The relay-served web vault (bench.web_serve, docs/web-vault.md "Served by the relay");
    the page's row only when the run had a browser."""
    served, verify, page = d["served"], d["verify"], d["page"]
    targets = [
        Target(
            "web_vault_served_vs_health",
            f"p50 of the relay's /vault/ (index.html with SRI) over p50 of /health, "
            f"{served['requests']} requests each, interleaved",
            served["ratio"],
            WEB_SERVED_RATIO,
            "<=",
            detail=f"/vault/ {served['page_p50_ms']:.2f} ms, js/app.js "
            f"{served['module_p50_ms']:.2f} ms, /health {served['health_p50_ms']:.2f} ms",
        ),
        Target(
            "web_verify_s",
            f"seconds of `web verify` against the relay ({verify['files']} files, the page), "
            f"median of {verify['runs']}; it finds nothing",
            verify["median_s"],
            WEB_VERIFY_LIMIT_S,
            "<=",
            extra_ok=verify["findings"] == 0,
            detail=f"max {verify['max_s']:.3f} s, findings {verify['findings']}",
        ),
    ]
    if "skipped" not in page:
        targets.append(
            Target(
                "web_vault_page_ms",
                "milliseconds from navigation to the modules run (SRI checked) at the relay's "
                f"/vault/ in Chromium, median of {page['runs']}",
                page["relay_median_ms"],
                WEB_PAGE_LIMIT_MS,
                "<=",
                detail=f"engram-sync web's page {page['local_median_ms']:.0f} ms",
            )
        )
    return targets

"""PNG plots of a run, when matplotlib is installed (`pip install -e '.[bench]'`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_plots(
    data: dict[str, Any], latencies: dict[str, list[float]], out: Path, stem: str
) -> tuple[list[str], str | None]:
    """Write the plots next to the report; (file names, None) or ([], why they were skipped)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "skipped: matplotlib is not installed (pip install -e '.[bench]')"
    sections = data["sections"]
    written: list[str] = []

    sweep = sections["sweep"]
    if not sweep.get("skipped"):
        sizes = [p["size"] for p in sweep["points"]]
        fig, (push_ax, pull_ax) = plt.subplots(1, 2, figsize=(11, 4))
        for ax, keys, xlabel in (
            (push_ax, ("ceiling_write", "relay_push"), "push batch size (blobs)"),
            (pull_ax, ("ceiling_read", "relay_pull"), "pull page size (blobs)"),
        ):
            for key in keys:
                ax.plot(sizes, [p[key] for p in sweep["points"]], marker="o", label=key)
            ax.set_xscale("log")
            ax.set_xticks(sizes, [str(s) for s in sizes])
            ax.set_xlabel(xlabel)
            ax.set_ylabel("blobs/s")
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.suptitle(f"Throughput against batch / page size ({sweep['blobs']:,} blobs per point)")
        fig.tight_layout()
        name = f"{stem}-throughput.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(name)

    if any(latencies.values()):
        fig, ax = plt.subplots(figsize=(9, 4))
        every = [v for values in latencies.values() for v in values if v > 0]
        low, high = min(every), max(every) * 1.01
        bins = [low * (high / low) ** (i / 80) for i in range(81)]  # log-spaced
        for mode, values in latencies.items():
            if values:
                ax.hist(values, bins=bins, alpha=0.5, label=mode.replace("_", " "))
        ax.set_xscale("log")
        ax.axvline(25.0, color="red", linestyle="--", label="p99 target 25 ms")
        ax.set_xlabel("push latency (ms)")
        ax.set_ylabel("requests")
        ax.set_title("Single-blob push latency (closed loop)")
        ax.legend()
        fig.tight_layout()
        name = f"{stem}-latency.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(name)

    samples = sections["relay_memory"]["samples"]
    if samples:
        fig, ax = plt.subplots(figsize=(11, 4))
        ax.plot([s["t_s"] for s in samples], [s["rss_mb"] for s in samples], color="black")
        spans: list[tuple[str, float, float]] = []
        for s in samples:
            if spans and spans[-1][0] == s["phase"]:
                spans[-1] = (s["phase"], spans[-1][1], s["t_s"])
            else:
                spans.append((s["phase"], s["t_s"], s["t_s"]))
        cmap = plt.get_cmap("tab10")
        phases = sorted({p for p, _, _ in spans if p != "idle"})
        colour = {p: cmap(i % 10) for i, p in enumerate(phases)}
        labelled: set[str] = set()
        for phase, begin, end in spans:
            if phase == "idle":
                continue
            label = None if phase in labelled else phase
            labelled.add(phase)
            ax.axvspan(begin, end, color=colour[phase], alpha=0.2, label=label)
        ax.set_xlabel("seconds since the relay started")
        ax.set_ylabel("relay RSS (MiB)")
        ax.set_ylim(bottom=0)
        ax.set_title("Relay resident memory over the run")
        ax.legend(loc="lower right", fontsize="small")
        fig.tight_layout()
        name = f"{stem}-relay-rss.png"
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(name)
    return written, None

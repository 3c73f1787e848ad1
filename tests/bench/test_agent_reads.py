"""Issue 36's agent rows (bench.agent_reads) at the quick size: a real vault of 300
memories, the real key agent, each command twice. It checks the harness (the agent
answers every command, the outputs hold what they should) and that every row gets a
verdict (never a speed: the machine is shared)."""

from __future__ import annotations

from pathlib import Path

from bench import agent_reads
from bench.targets import agent_reads_targets


def test_the_agent_rows_at_the_quick_size(tmp_path: Path) -> None:
    result = agent_reads.measure(tmp_path, quick=True)
    assert (result["memories"], result["runs"]) == (300, 2)
    for name in (*agent_reads.COMMANDS, "python_startup"):
        assert result[f"{name}_ms"]["median"] > 0
    sizes = result["output_bytes"]
    assert sizes["list_json"] > sizes["search_page_json"] > 0  # 300 memories against 20
    assert sizes["search_all_json"] > sizes["list_json"]  # the same memories, in an object
    targets = {t.name: t.as_json() for t in agent_reads_targets(result)}
    assert set(targets) == {
        "agent_search_page_ms",
        "agent_list_json_ms",
        "agent_search_all_json_ms",
    }
    assert all(t["verdict"] in ("PASS", "FAIL") for t in targets.values())

"""The three sizes of `python -m bench` (issue 36: the default run fits in 15 minutes on 2
cores, `--full` keeps the sizes of the older figures, `--quick` stays as it was) and the
load printed beside each row (bench.targets.judge, bench.stats.load_around)."""

from __future__ import annotations

import pytest

from bench.cli import _parser
from bench.settings import Settings
from bench.stats import load_around
from bench.targets import Target, loaded


def build(*argv: str) -> Settings:
    args = _parser().parse_args(list(argv))
    return Settings.build(quick=args.quick, full=args.full, n=args.n, memories=args.memories)


def test_the_default_run_is_smaller_than_the_full_one() -> None:
    default, full = build(), build("--full")
    assert (default.n, default.duration, default.large_vault, default.memories) == (
        20_000, 5.0, 50_000, 10_000,
    )  # fmt: skip
    assert (full.n, full.duration, full.large_vault, full.memories) == (
        100_000, 20.0, 200_000, 100_000,
    )  # fmt: skip
    assert default.repeats == 5  # the ratio rows: medians of >= 5 interleaved repeats
    assert default.small_sections
    assert not full.small_sections
    # issue 36's throughput ratios at their own sizes in the default run too
    assert not default.small_judged_rows
    assert not full.small_judged_rows


def test_quick_is_unchanged_and_explicit_options_win() -> None:
    quick = build("--quick")
    assert (quick.n, quick.duration, quick.repeats, quick.memories) == (2_000, 2.0, 1, 1_000)
    assert quick.small_sections
    assert quick.small_judged_rows
    assert build("--full", "--n", "3000", "--memories", "7").n == 3000
    with pytest.raises(ValueError, match="exclude"):
        build("--quick", "--full")


def test_each_row_carries_the_load_of_its_section() -> None:
    loads: dict[str, dict[str, float]] = {}
    with load_around(loads, "section"):
        pass
    assert set(loads["section"]) == {"before", "after"}
    row = Target("r", "a row", 1.0, 2.0, "<=", detail="and no errors")
    assert loaded(row.detail, {"before": 4.56, "after": 7.5}) == ("and no errors; load 4.6 -> 7.5")

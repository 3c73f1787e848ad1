"""Test tiers (issue 32): what `python -m pytest` runs, and the options that add the rest.

The README's command runs every kind of test at CI size. Four options add what needs more
infrastructure or time; a test's infrastructure decides its tier:

- `--citus`: the `[citus]` cases (the modules marked `both_databases`, tests/conftest.py) and
  every test on the `citus_cluster` fixture (Citus built once, a coordinator and two
  workers); `--citus-all` gives every database test a `[citus]` case;
- `--docker`: the tests on the private Docker engine and the relay's image
  (tests/deploy/docker_env.py);
- `--wheel`: the tests on the wheel installed into fresh venvs (tests/test_distribution.py);
- `--full`: the full sizes (500 convergence examples, 20 random re-key kills through the client
  and through the relay, 20 live-feed chaos rounds, the other kill points) and the cases marked
  `full`.

A fixture that needs a tier's infrastructure says so with `@needs("citus")` (under its
`@pytest.fixture`); every test using it, directly or through another fixture, gets the marker
of that tier (so `-m "citus or docker or wheel"` selects the tier's tests alone) and, while
the option is off, is skipped with "needs --citus". The terminal summary's last lines count
what was left out and how to run it. With the option on, infrastructure that cannot be made
here is an error (`unavailable`), not a skip, so a tier run cannot pass by running nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

import pytest

#: Each tier, and what it runs (the marker's description).
TIERS = {
    "citus": "needs the Citus cluster (--citus; --citus-all: every database test on Citus too)",
    "docker": "needs the private Docker engine and the relay's image (--docker)",
    "wheel": "needs the wheel installed into fresh venvs (--wheel)",
    "full": "a full-size case or size (--full)",
}
#: The tiers that are infrastructure (`.ci/run` runs them after the README's command).
INFRASTRUCTURE = ("citus", "docker", "wheel")
_ATTRIBUTE = "engram_tier"
_REASON = "needs --{tier}"
F = TypeVar("F", bound=Callable[..., object])

_enabled: set[str] = set()
_citus_everywhere = False
#: nodeid -> the tier that left it out (filled at collection, counted in the summary).
_left_out: dict[str, str] = {}
#: The tests selected (after `-k`/`-m`), kept by `pytest_collection_finish`.
SELECTED = pytest.StashKey[list[pytest.Item]]()


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("engram-sync tiers", "test tiers (tests/tiers.py, README)")
    group.addoption(
        "--full",
        action="store_true",
        help="full sizes: 500 convergence examples, 20 re-key kills, 20 chaos rounds, ...",
    )
    group.addoption(
        "--citus", action="store_true", help="run the [citus] cases and the Citus cluster tests"
    )
    group.addoption(
        "--citus-all",
        action="store_true",
        help="--citus, and a [citus] case for every database test (not only both_databases)",
    )
    group.addoption("--docker", action="store_true", help="run the Docker image tests")
    group.addoption("--wheel", action="store_true", help="run the fresh-venv wheel installs")


def configure(config: pytest.Config) -> None:
    global _citus_everywhere
    _enabled.clear()
    _left_out.clear()
    _citus_everywhere = bool(config.getoption("--citus-all"))
    for tier in TIERS:
        if config.getoption(f"--{tier}") or (tier == "citus" and _citus_everywhere):
            _enabled.add(tier)
    for tier, description in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {description}")


def enabled(tier: str) -> bool:
    """Whether this session runs `tier` (its option was given)."""
    return tier in _enabled


def full() -> bool:
    """Whether this session runs the full sizes (`--full`)."""
    return enabled("full")


def citus_everywhere() -> bool:
    """`--citus-all`: every test on a backend fixture gets a `[citus]` case."""
    return _citus_everywhere


def needs(tier: str) -> Callable[[F], F]:
    """Mark a fixture function (under its `@pytest.fixture`) as needing `tier`'s
    infrastructure: the tests using it belong to that tier."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}")

    def mark(fixture_function: F) -> F:
        setattr(fixture_function, _ATTRIBUTE, tier)
        return fixture_function

    return mark


def require(tier: str) -> None:
    """Skip unless `tier` is on: for fixtures reached without the marker (getfixturevalue)."""
    if not enabled(tier):
        pytest.skip(_REASON.format(tier=tier))


def unavailable(tier: str, reason: str) -> None:
    """`tier`'s infrastructure cannot be made here: an error when the tier was asked for."""
    pytest.fail(f"--{tier} was given but {reason}", pytrace=False)


def tiers_of(item: pytest.Item) -> set[str]:
    """The tiers `item` belongs to: its fixtures' (`needs`), a `[citus]` case's, its markers'."""
    found: set[str] = set()
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name in info.names_closure:
            definitions = info.name2fixturedefs.get(name)
            if definitions:
                tier = getattr(definitions[-1].func, _ATTRIBUTE, None)
                if tier is not None:
                    found.add(tier)
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "citus" in callspec.params.values():
        found.add("citus")
    found.update(tier for tier in TIERS if item.get_closest_marker(tier) is not None)
    return found


def apply(items: Iterable[pytest.Item]) -> None:
    """Give each item its tiers' markers, and skip it while one of them is off."""
    for item in items:
        tiers = tiers_of(item)
        for tier in sorted(tiers):
            item.add_marker(getattr(pytest.mark, tier))
        off = [tier for tier in sorted(tiers) if not enabled(tier)]
        if off:
            # the infrastructure tier first: `--full` alone would not run a [citus] case
            tier = next((t for t in off if t in INFRASTRUCTURE), off[0])
            item.add_marker(pytest.mark.skip(reason=_REASON.format(tier=tier)))
            _left_out[item.nodeid] = tier


def summary_lines(
    selected: Iterable[pytest.Item], skipped: Iterable[pytest.TestReport] = ()
) -> list[str]:
    """'left out: N tests need --citus (run: python -m pytest --citus)' per tier left out of
    the `selected` tests (those left after `-k`/`-m`). Under pytest-xdist (`-n 2`) the
    controller collects nothing: the tiers are counted from the workers' `skipped` reports,
    by their reason (`needs --TIER`)."""
    counts = Counter(_left_out[item.nodeid] for item in selected if item.nodeid in _left_out)
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        tier = reason.removeprefix("Skipped: ").removeprefix("needs --")
        if reason.endswith(_REASON.format(tier=tier)) and tier in TIERS:
            counts[tier] += 1
    lines = [
        f"left out: {counts[tier]} {'test needs' if counts[tier] == 1 else 'tests need'}"
        f" --{tier} (run: python -m pytest --{tier})"
        for tier in TIERS
        if counts[tier]
    ]
    if not lines:
        lines.append("left out: nothing (every tier of the selected tests ran)")
    return lines

"""bench.digest_push's `before` relay: relay.store.push without the digest, from its source.

The figure is only what it says if the variant differs from the relay in the digest and
nothing else, and if an edit of push.py that moves one of its cuts fails the bench
instead of measuring something else. (The quick bench run drives it end to end against
two relays; tests/bench/test_bench_quick.py.)
"""

from __future__ import annotations

import inspect

import pytest

from bench import digest_push
from engram_sync.relay.store import push

# (`while_answered` stays in both: the reads overlap §6 step 1's check in both, issue 36)
_DIGEST_AT_WORK = (
    "version_hash(", "_bucket_and_hash(", "_fold_", "versions.append(", "digest_bytes("
)  # fmt: skip


def _code(source: str) -> str:
    return "\n".join(line.split("#")[0] for line in source.splitlines() if "import" not in line)


def test_the_before_source_is_the_push_without_the_digest() -> None:
    real = inspect.getsource(push)
    before = digest_push.before_source()
    compile(before, "<before>", "exec")
    for text in _DIGEST_AT_WORK:
        assert text in _code(real)  # the relay's push does this work ...
    body = [line for line in _code(before).splitlines() if not line.lstrip().startswith('"')]
    for text in _DIGEST_AT_WORK:
        assert not any(text in line for line in body), text  # ... and the variant does not
    # and nothing else changed: a line of the variant not in the relay's push is one
    # that a cut's replacement made
    made = [
        part.strip()
        for _, new, _ in digest_push._WITHOUT_DIGEST
        for part in new.splitlines()
        if part.strip()
    ]
    lines = set(real.splitlines())
    changed = [line for line in before.splitlines() if line not in lines]
    assert changed
    assert all(any(m in line for m in made) for line in changed), changed


def test_a_cut_that_no_longer_matches_fails_the_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    moved = [*digest_push._WITHOUT_DIGEST, ("    a line push.py does not have\n", "", 1)]
    monkeypatch.setattr(digest_push, "_WITHOUT_DIGEST", moved)
    with pytest.raises(RuntimeError, match=r"relay\.store\.push changed"):
        digest_push.before_source()

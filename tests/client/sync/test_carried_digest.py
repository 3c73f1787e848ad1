"""Which carried digest stands in for `GET /digest` (client._sync.anti_entropy.carried_answer;
ours, docs/digest.md "Carried in push and pull answers"): only one at the device's cursor."""

from __future__ import annotations

from msgspec import UNSET

from engram_sync.client._sync.anti_entropy import carried_answer, carried_of
from engram_sync.shared_format.digest import DigestAnswer
from engram_sync.shared_format.wire import PullResponse, PushResponse, VaultDigest, decode_json

CARRIED = VaultDigest(cursor=7, count=3, digest="AAAA")


def test_only_a_digest_at_the_cursor_is_used() -> None:
    assert carried_answer(CARRIED, cursor=7) == DigestAnswer(cursor=7, count=3, digest="AAAA")
    assert carried_answer(CARRIED, cursor=6) is None  # commits the device has not pulled
    assert carried_answer(CARRIED, cursor=8) is None  # older than what the device holds
    assert carried_answer(None, cursor=7) is None  # none carried (an older relay)


def test_answers_with_and_without_the_field() -> None:
    assert carried_of(UNSET) is None
    assert carried_of(CARRIED) is CARRIED
    push = decode_json(
        b'{"accepted":1,"cursor":7,"vault_digest":{"cursor":7,"count":3,"digest":"AAAA"}}',
        PushResponse,
    )
    assert carried_of(push.vault_digest) == CARRIED
    core = decode_json(b'{"blobs":[],"has_more":false}', PullResponse)  # the §5 core
    assert carried_of(core.vault_digest) is None

"""PROTOCOL §19 successor statement: known-answer values (computed once, with `openssl dgst
-sha256 -mac HMAC`, never by the code under test) and the refusals."""

from __future__ import annotations

import pytest

from engram_sync.shared_format.successor_statement import (
    StatementError,
    make_statement,
    statement_message,
    statement_verifies,
)

KEY = bytes(range(32))
OLD, NEW, AT = "old-vault", "new-vault", "2026-12-04T17:00:00.000000+00:00"
# printf 'engram-successor-v1\x00old-vault\x00new-vault\x002026-12-04T17:00:00.000000+00:00'
#   | openssl dgst -sha256 -mac HMAC -macopt hexkey:000102...1f -binary | base64
GOLDEN = "sfB5iTVhZnQMAaje6IP7wWoaNLwvdACFJU3+LIPNYIo="
# the hmac key of PROTOCOL §2's golden passphrase (tests/shared_format/test_keys.py)
GOLDEN_HMAC_KEY = bytes.fromhex("8f6eacda4edc1244b2895f03593fa450c0712bb0a55abb0946fa540c5301dd26")
GOLDEN_OLD = "f12cfc020e8f2617d25e815aac10ac29b9976567614222be954e44cbef329684"
GOLDEN_2 = "Gt/l6M6jSQrTwl3XUQCLIhrbJ6z7PyhRCtEQsNOt3d8="


def test_the_message_is_the_tag_and_the_fields_joined_by_nul() -> None:
    assert statement_message(OLD, NEW, AT) == (
        b"engram-successor-v1\x00old-vault\x00new-vault\x002026-12-04T17:00:00.000000+00:00"
    )


def test_golden_statements() -> None:
    assert make_statement(KEY, OLD, NEW, AT) == GOLDEN
    assert make_statement(GOLDEN_HMAC_KEY, GOLDEN_OLD, "team-vault", "2026-12-04T17:00:00Z") == (
        GOLDEN_2
    )
    assert statement_verifies(KEY, OLD, NEW, AT, GOLDEN)
    assert statement_verifies(GOLDEN_HMAC_KEY, GOLDEN_OLD, "team-vault", "2026-12-04T17:00:00Z",
                              GOLDEN_2)  # fmt: skip


def test_another_successor_vault_key_or_time_is_refused() -> None:
    assert not statement_verifies(KEY, OLD, "another-vault", AT, GOLDEN)  # another successor
    assert not statement_verifies(KEY, "another-old", NEW, AT, GOLDEN)  # replayed elsewhere
    assert not statement_verifies(bytes(32), OLD, NEW, AT, GOLDEN)  # another vault's key
    assert not statement_verifies(KEY, OLD, NEW, AT + " ", GOLDEN)
    flipped = ("A" if GOLDEN[0] != "A" else "B") + GOLDEN[1:]
    assert not statement_verifies(KEY, OLD, NEW, AT, flipped)  # a wrong MAC


@pytest.mark.parametrize(
    ("stated_at", "statement"),
    [
        (None, GOLDEN),
        (AT, None),
        (AT, ""),
        (AT, GOLDEN[:-4]),  # 24 bytes
        (AT, GOLDEN + "AAAA"),
        (AT, "not base64 at all, not base64 at all, not b!"),
        (AT, 12),
        ("x" * 65, GOLDEN),
        ("", GOLDEN),
    ],
)
def test_malformed_statements_are_refused(stated_at: object, statement: object) -> None:
    assert not statement_verifies(KEY, OLD, NEW, stated_at, statement)


def test_a_field_with_nul_cannot_be_stated() -> None:
    # "a\0b" + "c" and "a" + "b\0c" would be the same message
    with pytest.raises(StatementError):
        make_statement(KEY, "a\x00b", "c", AT)
    assert not statement_verifies(KEY, OLD, NEW, "2026\x00", GOLDEN)

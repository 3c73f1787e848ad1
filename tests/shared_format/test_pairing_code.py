"""Pairing codes with and without the secret part (shared_format.pairing, PROTOCOL §14 step 4)."""

from __future__ import annotations

import hashlib
import re

import pytest

from engram_sync.shared_format.pairing import (
    PairingCode,
    PairingCodeError,
    is_pairing_id,
    new_pairing_code,
    new_pairing_secret,
    normalize_pairing_code,
    pairing_id,
    parse_pairing_code,
    with_secret,
)

SYMBOL = "[0-9A-HJKMNP-TV-Z]"
FULL = re.compile(rf"ENG-{SYMBOL}{{4}}-{SYMBOL}{{4}}-{SYMBOL}{{4}}-{SYMBOL}{{4}}-{SYMBOL}{{4}}")


def test_full_code_splits_into_relay_part_and_secret() -> None:
    code = parse_pairing_code(" eng 7k3m q9xa d2pf abcd efgo ")
    assert code.relay_code == "ENG-7K3M-Q9XA-D2PF"
    assert code.secret == "ABCD-EFG0"  # look-alikes mapped in the secret part too
    assert code.full == "ENG-7K3M-Q9XA-D2PF-ABCD-EFG0"
    assert parse_pairing_code("7K3MQ9XAD2PFABCDEFG0") == code
    assert parse_pairing_code("ENG7K3MQ9XAD2PFABCDEFG0") == code
    assert "ABCD" not in repr(code)  # the secret part is not in reprs (logs)


def test_old_codes_have_no_secret() -> None:
    code = parse_pairing_code("eng-7k3m-q9xa-d2pf")
    assert code == PairingCode("ENG-7K3M-Q9XA-D2PF", None)
    assert code.full == "ENG-7K3M-Q9XA-D2PF"


def test_the_relay_never_takes_a_secret_part() -> None:
    with pytest.raises(PairingCodeError):
        normalize_pairing_code("ENG-7K3M-Q9XA-D2PF-ABCD-EFGH")


def test_bad_codes() -> None:
    for bad in (
        "ENG-7K3M-Q9XA",
        "ENG-7K3M-Q9XA-D2PF-ABCD",  # 16 symbols
        "ENG-7K3M-Q9XA-D2PF-ABCD-EFGU",  # U is not in the alphabet
        "ENG-7K3M-Q9XA-D2PF-ABCD-EFGH-0000",
        "",
    ):
        with pytest.raises(PairingCodeError):
            parse_pairing_code(bad)


def test_new_secret_and_the_whole_code() -> None:
    secrets_ = {new_pairing_secret() for _ in range(50)}
    assert len(secrets_) == 50
    relay_code = new_pairing_code()
    secret = secrets_.pop()
    whole = with_secret(relay_code, secret)
    assert FULL.fullmatch(whole.full)
    assert parse_pairing_code(whole.full) == whole
    assert (whole.relay_code, whole.secret) == (relay_code, secret)


def test_pairing_id_is_the_hash_the_relay_keeps() -> None:
    code = parse_pairing_code("ENG-7K3M-Q9XA-D2PF-ABCD-EFGH")
    expected = hashlib.sha256(b"ENG-7K3M-Q9XA-D2PF").hexdigest()
    assert code.pairing_id == pairing_id("eng 7k3m q9xa d2pf") == expected
    assert expected == "08164631e504784f7fd011d998c8c4e626164ada68ff2e0746d7c7b3a08bce26"
    assert is_pairing_id(expected)
    assert not is_pairing_id(expected.upper())
    assert not is_pairing_id(expected[:-1])

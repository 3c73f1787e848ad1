"""Unit tests of relay/domain/api_keys.py: `SYNC_API_KEYS` parsing (PROTOCOL §5), minting,
hashing."""

from __future__ import annotations

import hashlib
import logging

import pytest

from engram_sync.relay.domain.api_keys import (
    DEFAULT_KEY_RATE,
    Principal,
    hash_key,
    key_prefix,
    mint_key,
    parse_static_keys,
)
from engram_sync.relay.services.config import config_from_env
from engram_sync.shared_format.b64 import b64url_decode

KEY_A = "a" * 16
KEY_B = "static-key-bbbbbbbbbbbb"
KEY_C = "static-key-cccccccccccc"


def only(spec: str) -> Principal:
    keys = parse_static_keys(spec)
    assert len(keys) == 1, keys
    return keys[0].principal


def test_bare_key_reaches_every_vault_as_admin_at_the_default_rate() -> None:
    principal = only(KEY_B)
    assert principal.rate == DEFAULT_KEY_RATE == 100
    assert principal.vaults is None
    assert principal.admin_vaults is None
    assert principal.is_global_admin
    assert principal.can_access("any-vault")
    assert principal.is_admin_for("any-vault")
    assert principal.device_id is None


def test_rate_is_the_second_field() -> None:
    assert only(f"{KEY_B}:7").rate == 7
    assert only(f"{KEY_B}:").rate == DEFAULT_KEY_RATE  # empty rate = default


def test_scope_lists_vaults_and_admin_marks() -> None:
    principal = only(f"{KEY_B}:20:team-a;team-b+admin; team-c ")
    assert principal.rate == 20
    assert principal.vaults == frozenset({"team-a", "team-b", "team-c"})
    assert principal.admin_vaults == frozenset({"team-b"})
    assert not principal.is_global_admin
    assert principal.can_access("team-a")
    assert not principal.is_admin_for("team-a")
    assert principal.is_admin_for("team-b")
    assert principal.can_access("team-c")
    assert not principal.can_access("team-d")
    assert not principal.is_admin_for("team-d")


def test_scope_with_the_default_rate() -> None:
    principal = only(f"{KEY_B}::solo")
    assert principal.rate == DEFAULT_KEY_RATE
    assert principal.vaults == frozenset({"solo"})
    assert principal.admin_vaults == frozenset()
    assert not principal.is_admin_for("solo")


def test_empty_scope_means_every_vault() -> None:
    principal = only(f"{KEY_B}:5:")
    assert principal.vaults is None
    assert principal.is_global_admin


def test_keys_shorter_than_16_characters_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="engram_sync.relay.domain.api_keys"):
        keys = parse_static_keys(f"{'x' * 15},{KEY_A}:3,short:9:v")
    assert [k.principal.rate for k in keys] == [3]  # exactly 16 characters is enough
    assert keys[0].key_hash == hash_key(KEY_A)
    assert "x" * 15 not in caplog.text  # a rejected key is never logged
    assert "shorter than 16" in caplog.text


@pytest.mark.parametrize("rate", ["abc", "0", "-5", "1.5"])
def test_entries_with_a_bad_rate_are_skipped(rate: str) -> None:
    keys = parse_static_keys(f"{KEY_B}:{rate},{KEY_C}")
    assert [k.key_hash for k in keys] == [hash_key(KEY_C)]


def test_several_entries_whitespace_and_empty_items() -> None:
    keys = parse_static_keys(f" {KEY_B}:10 , ,{KEY_C}:20:v1+admin ,")
    assert [k.key_hash for k in keys] == [hash_key(KEY_B), hash_key(KEY_C)]
    first, second = (k.principal for k in keys)
    assert first.key_id != second.key_id
    assert first.prefix == key_prefix(KEY_B) == KEY_B[:8]
    assert second.admin_vaults == frozenset({"v1"})
    assert parse_static_keys("") == []
    assert parse_static_keys(" , ") == []


def test_static_keys_are_kept_only_as_hashes() -> None:
    (static,) = parse_static_keys(f"{KEY_B}:10:v")
    assert static.key_hash == hashlib.sha256(KEY_B.encode()).digest()
    assert KEY_B not in repr(static)


def test_config_repr_shows_neither_keys_nor_the_database_password() -> None:
    config = config_from_env(
        "postgresql://postgres:s3cret-db-pw@127.0.0.1:5432/relay",
        {"SYNC_API_KEYS": f"{KEY_B}:10:v"},
    )
    assert config.database_url.endswith("/relay")  # the URL is kept, only not shown
    assert "s3cret-db-pw" not in repr(config)
    assert KEY_B not in repr(config)
    assert "quota_devices=0" in repr(config)


def test_minted_keys_have_the_protocol_shape_and_are_unique() -> None:
    keys = {mint_key() for _ in range(50)}
    assert len(keys) == 50
    for key in keys:
        assert key.startswith("en_")
        assert "=" not in key
        assert len(b64url_decode(key.removeprefix("en_"))) == 32
        assert hash_key(key) == hashlib.sha256(key.encode()).digest()


def test_principal_bound_to_one_vault() -> None:
    principal = Principal("k_1", "en_abcde", 100, frozenset({"v"}), None, device_id="d")
    assert principal.can_access("v")
    assert principal.is_admin_for("v")
    assert not principal.can_access("w")
    assert not principal.is_admin_for("w")
    assert not principal.is_global_admin


def test_config_reads_sync_api_keys_from_the_environment() -> None:
    env = {"SYNC_API_KEYS": f"{KEY_B}:9:v+admin,tiny", "ENGRAM_RELAY_QUOTA_BYTES": "123"}
    config = config_from_env("postgresql://u@h/db", env)
    assert config.quota_bytes == 123
    assert [k.principal.rate for k in config.static_keys] == [9]
    assert KEY_B not in repr(config)

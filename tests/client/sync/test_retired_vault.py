"""A retired vault on the device side, without a relay (PROTOCOL §19): the 410 answer parsed
into a typed error with a bounded successor hint, the hint kept in sync_state.json, and the
words for the person. The flows against a real relay are in tests/e2e/test_retired_vault.py
and tests/e2e/hostile/test_retired_lies.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_sync.client._errors import RelayError, VaultRetiredError, relay_error, vault_id_hint
from engram_sync.client._sync.retirement import note_retired, retired_message
from engram_sync.client._sync.state import SyncState


def _body(**fields: object) -> bytes:
    return json.dumps({"error": "vault retired", "code": "vault_retired", **fields}).encode()


def test_a_410_vault_retired_is_a_typed_error_with_its_successor() -> None:
    error = relay_error(410, _body(successor="b" * 64))
    assert isinstance(error, VaultRetiredError)
    assert (error.status, error.code, error.successor) == (410, "vault_retired", "b" * 64)


@pytest.mark.parametrize(
    "successor",
    [None, "", 42, ["x"], "x" * 257, "evil\nvault", "nul\x00"],
    ids=["null", "empty", "number", "list", "too long", "newline", "nul"],
)
def test_a_successor_that_cannot_be_a_vault_id_is_no_hint(successor: object) -> None:
    error = relay_error(410, _body(successor=successor))
    assert isinstance(error, VaultRetiredError)
    assert error.successor is None
    assert vault_id_hint("x" * 256) == "x" * 256  # the positive case: at the bound


def test_another_410_stays_a_plain_relay_error() -> None:
    error = relay_error(410, json.dumps({"error": "gone", "code": "expired"}).encode())
    assert type(error) is RelayError


def test_the_hint_survives_a_restart_and_a_new_link_clears_it(tmp_path: Path) -> None:
    state = SyncState.load(tmp_path)
    state.bind("http://relay", "old")
    note_retired(state, "old", successor="new", erase_after="2030-01-01T00:00:00Z", source="pull")
    state.save()
    loaded = SyncState.load(tmp_path)
    assert loaded.retired is not None
    assert (loaded.retired.successor, loaded.retired.source) == ("new", "pull")
    # a push's 410 does not say when the old blobs go: what the pull said is kept
    note_retired(loaded, "old", successor="new", source="push")
    assert loaded.retired.erase_after == "2030-01-01T00:00:00Z"
    loaded.bind("http://relay", "new")
    assert loaded.retired is None


def test_a_vault_is_never_its_own_successor(tmp_path: Path) -> None:
    state = SyncState.load(tmp_path)
    hint = note_retired(state, "old", successor="old", source="events")
    assert hint.successor is None


def test_a_broken_hint_in_the_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "sync_state.json").write_text(json.dumps({"cursor": 3, "retired": "yes"}))
    state = SyncState.load(tmp_path)
    assert state.retired is None
    assert state.cursor == 3


def test_the_message_says_what_happened_and_what_to_do(tmp_path: Path) -> None:
    hint = note_retired(SyncState.load(tmp_path), "old", successor="new", source="push")
    message = retired_message(hint, pending=7, key_source="passphrase")
    assert "vault old was re-keyed on another device" in message
    assert "new as the new vault" in message
    assert "7 unpushed change(s) are kept" in message
    assert "`engram-sync rekey --join`" in message
    assert "account password" in retired_message(hint, pending=0, key_source="account")
    assert "team request" in retired_message(hint, pending=0, key_source="handoff")

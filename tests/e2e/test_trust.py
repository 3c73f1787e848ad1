"""Tampered blobs, revoked devices and wrong passphrases (PROTOCOL §3, §10; VAULT §2)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from engram_sync.client._errors import DeviceRevokedError
from engram_sync.shared_format import WrongPassphraseError
from tests.e2e.conftest import VAULT_ID, DeviceHandle, make_device
from tests.e2e.helpers import add, contents, edit
from tests.relay.conftest import Relay


def test_tampered_blob_is_skipped_reported_and_never_applied(devices: list[DeviceHandle]) -> None:
    alpha, bravo, _ = devices
    good = add(alpha, "untouched")
    evil = add(alpha, "original text")
    alpha.sync()
    (row,) = alpha.relay.sql(
        "SELECT ciphertext, vector_clock FROM blobs WHERE memory_id = $1", evil
    )
    raw = bytearray(base64.b64decode(row["ciphertext"]))
    raw[20] ^= 0x01
    alpha.relay.sql(
        "UPDATE blobs SET ciphertext = $2, vector_clock = vector_clock + 1000 WHERE memory_id = $1",
        evil,
        base64.b64encode(bytes(raw)).decode(),
    )
    report = bravo.sync()
    assert report.invalid == 1
    assert report.applied == 1
    held = contents(bravo)
    assert held == {good: "untouched"}
    with bravo.open() as session:
        (skipped,) = session.state.skipped
        assert skipped.memory_id == evil
        assert "BlobTamperedError" in skipped.reason
        assert session.device.vector_clock < row["vector_clock"] + 1000  # not raised by it


def test_revoked_device_is_told_in_words(tmp_path: Path, relay: Relay) -> None:
    admin = make_device(tmp_path, relay, "admin")
    laptop = make_device(
        tmp_path, relay, "laptop", key=lambda device_id: relay.mint(VAULT_ID, device_id=device_id)
    )
    with laptop.open() as session:
        device_id = session.device.device_id
    add(laptop, "written before revocation")
    laptop.sync()
    with admin.relay_client() as client:
        client.revoke_device(VAULT_ID, device_id)
    add(laptop, "written after revocation")
    with pytest.raises(DeviceRevokedError) as info:
        laptop.sync()
    message = str(info.value)
    assert "revoked" in message
    assert device_id in message
    assert "new key" in message
    with laptop.open() as session:
        assert session.state.revoked is True
    # the others keep syncing and never see the post-revocation memory
    admin.sync()
    assert sorted(contents(admin).values()) == ["written before revocation"]


def test_wrong_passphrase_writes_nothing(devices: list[DeviceHandle]) -> None:
    alpha = devices[0]
    memory_id = add(alpha, "secret")
    alpha.sync()
    alpha.restart()
    before = {p.name: p.stat().st_mtime_ns for p in alpha.path.iterdir()}
    wrong = DeviceHandle(alpha.name, alpha.path, alpha.relay, passphrase="not the passphrase")
    with pytest.raises(WrongPassphraseError, match="wrong passphrase"):
        wrong.open()
    after = {p.name: p.stat().st_mtime_ns for p in alpha.path.iterdir()}
    assert after == before
    edit(alpha, memory_id, "still opens with the right one")
    assert contents(alpha)[memory_id] == "still opens with the right one"

"""A deliberately separate implementation of PROTOCOL §2-§4 for cross-checking the client.

Written from the spec text with the primitives only (argon2-cffi, cryptography's
AESGCM, hmac, base64, struct, json); nothing here imports shared_format or client.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import struct
from datetime import UTC, datetime
from typing import Any

from argon2.low_level import Type, hash_secret_raw
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


def derive(passphrase: str, tag: str) -> bytes:
    salt = hashlib.sha256(tag.encode()).digest()[:16]
    return hash_secret_raw(
        passphrase.encode(), salt, time_cost=3, memory_cost=65536, parallelism=4,
        hash_len=32, type=Type.ID, version=0x13,
    )  # fmt: skip


def keys(passphrase: str) -> tuple[bytes, bytes]:
    return derive(passphrase, "axiom-sync-enc-v2"), derive(passphrase, "axiom-sync-hmac-v2")


def mac(hmac_key: bytes, blob: dict[str, Any]) -> str:
    message = (
        blob["vault_id"].encode()
        + blob["memory_id"].encode()
        + blob["device_id"].encode()
        + struct.pack("<Q", blob["vector_clock"])
        + blob["ciphertext"].encode("ascii")
        + (b"\x01" if blob["deleted"] else b"\x00")
        + blob["created_at"].encode()
    )
    return base64.b64encode(hmac.new(hmac_key, message, hashlib.sha256).digest()).decode()


def open_blob(enc_key: bytes, hmac_key: bytes, blob: dict[str, Any]) -> dict[str, Any]:
    """Verify the HMAC, then decrypt; returns the plaintext object."""
    if not hmac.compare_digest(mac(hmac_key, blob), blob["hmac"]):
        raise ValueError("hmac mismatch")
    raw = base64.b64decode(blob["ciphertext"], validate=True)
    plaintext = AESGCM(enc_key).decrypt(raw[:12], raw[12:], None)
    result: dict[str, Any] = json.loads(plaintext)
    return result


def seal_blob(
    enc_key: bytes,
    hmac_key: bytes,
    obj: dict[str, Any],
    *,
    vault_id: str,
    device_id: str,
    clock: int,
    deleted: bool = False,
) -> dict[str, Any]:
    nonce = os.urandom(12)
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    ciphertext = base64.b64encode(nonce + AESGCM(enc_key).encrypt(nonce, text.encode(), None))
    blob: dict[str, Any] = {
        "vault_id": vault_id,
        "memory_id": obj["id"],
        "device_id": device_id,
        "vector_clock": clock,
        "ciphertext": ciphertext.decode(),
        "created_at": datetime.now(UTC).isoformat(),
        "deleted": deleted,
    }
    blob["hmac"] = mac(hmac_key, blob)
    return blob


def memory(memory_id: str, content: str) -> dict[str, Any]:
    """A live memory with exactly the keys of PROTOCOL §4."""
    now = datetime.now(UTC).isoformat()
    return {
        "id": memory_id, "content": content, "layer": "semantic", "scope": "rule",
        "content_type": "text", "source": "ai-tool", "privacy_level": "hybrid",
        "context": {"from": "independent"}, "created_at": now, "modified_at": now,
        "last_retrieved": None, "occurred_at": None, "project": "interop",
        "tags": ["interop"], "strength": 1.25, "valence": 0.5, "retrievals": 2,
        "imagined": False, "grounded": True, "links": [], "embedding": [0.25, -0.5],
        "embedding_model": "test-model",
    }  # fmt: skip

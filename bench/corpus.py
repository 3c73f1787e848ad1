"""Realistic blobs, made once per run and reused by every measurement.

Each blob is the real `BlobCipher.seal` output of a real PROTOCOL §4 plaintext
(a memory of about 100 characters of text with tags and a project), padded to
its PADMÉ length as a device pads it (PROTOCOL §16): a raw ciphertext of about
600 bytes (nonce + AES-GCM + tag), about 800 base64 characters on the wire.
Envelopes for a given vault get their own real HMAC (the HMAC covers the vault
id), so every blob a measurement sends is one a device could have sent.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from engram_sync.shared_format.b64 import b64encode_std
from engram_sync.shared_format.blob import NONCE_LEN, TAG_LEN, BlobCipher, blob_hmac
from engram_sync.shared_format.padding import pad_plaintext
from engram_sync.shared_format.plaintext import MemoryPlaintext, encode_memory
from engram_sync.shared_format.sync_keys import SyncKeys
from engram_sync.shared_format.timestamps import utc_now_rfc3339
from engram_sync.shared_format.wire import SyncBlob

_WORDS: Final = (  # noqa: SIM905 - one readable block of text
    "deploy release staging rollback migration schema index query cache latency budget "
    "review meeting notes decision owner follow-up customer ticket incident alert "
    "postgres relay vault device key rotation backup restore drill metrics dashboard "
    "the a of to for with on after before during because when while and but so then "
    "Alice Bob Carol Dave friday monday sprint roadmap design draft spec test flaky "
    "build pipeline runner docker compose caddy certificate renewal timeout retry"
).split()
_TAGS: Final = ("ops", "deploy", "meeting", "idea", "bug", "todo", "people", "infra", "docs")
_PROJECTS: Final = (None, "engram-sync", "relay", "website", "hiring")
_LAYERS: Final = ("episodic", "episodic", "semantic")


def sentence(rng: random.Random, min_chars: int = 60, max_chars: int = 140) -> str:
    """A plausible memory text of min_chars..max_chars characters."""
    target = rng.randint(min_chars, max_chars)
    words: list[str] = []
    length = 0
    while length < target:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    text = " ".join(words)[:target].rstrip()
    return text[:1].upper() + text[1:] + "."


def tags(rng: random.Random) -> list[str]:
    """Zero to three tags."""
    return rng.sample(_TAGS, rng.randint(0, 3))


def project(rng: random.Random) -> str | None:
    """A project, or none."""
    return rng.choice(_PROJECTS)


def memory_plaintext(rng: random.Random, memory_id: str, stamp: str) -> MemoryPlaintext:
    """A live memory as a device encrypts it (PROTOCOL §4)."""
    return MemoryPlaintext(
        id=memory_id,
        content=sentence(rng),
        layer=rng.choice(_LAYERS),
        scope="moment",
        content_type="text",
        source="user",
        privacy_level="cloud_first",
        context={},
        created_at=stamp,
        modified_at=stamp,
        last_retrieved=None,
        occurred_at=None,
        project=project(rng),
        tags=tags(rng),
        strength=1.0,
        valence=round(rng.uniform(-0.5, 0.5), 3),
        retrievals=rng.randint(0, 5),
        imagined=False,
        grounded=False,
        links=[],
        embedding=None,
        embedding_model=None,
    )


def base64_chars(plaintext_bytes: int) -> int:
    """Base64 characters of the ciphertext of a plaintext of that many bytes (§3)."""
    return 4 * ((NONCE_LEN + plaintext_bytes + TAG_LEN + 2) // 3)


def new_memory_id(rng: random.Random) -> str:
    """`mem_` + 16 characters of a UUIDv4, like a device makes them (VAULT §3)."""
    return "mem_" + str(uuid.UUID(int=rng.getrandbits(128), version=4))[:16]


@dataclass(frozen=True)
class Corpus:
    """`size` sealed memories; `envelopes()` wraps them for a vault with real HMACs."""

    memory_ids: list[str]
    ciphertexts: list[str]
    created_at: list[str]
    hmac_key: bytes
    unpadded_chars: int = 0  # base64 characters the ciphertexts would take unpadded (§16)

    @property
    def size(self) -> int:
        """How many distinct ciphertexts there are."""
        return len(self.ciphertexts)

    @classmethod
    def make(cls, size: int, seed: int = 7) -> Corpus:
        """Seal `size` realistic plaintexts under fresh random sync keys."""
        rng = random.Random(seed)  # noqa: S311 - test data, not crypto
        keys = SyncKeys(enc_key=os.urandom(32), hmac_key=os.urandom(32))
        cipher = BlobCipher(keys)
        ids: list[str] = []
        texts: list[str] = []
        stamps: list[str] = []
        unpadded = 0
        for _ in range(size):
            memory_id = new_memory_id(rng)
            stamp = utc_now_rfc3339()
            text = encode_memory(memory_plaintext(rng, memory_id, stamp))
            unpadded += base64_chars(len(text.encode("utf-8")))
            blob = cipher.seal(
                pad_plaintext(text),  # PROTOCOL §16, as the client's push path does
                vault_id="corpus",
                memory_id=memory_id,
                device_id="corpus",
                vector_clock=1,
                deleted=False,
                created_at=stamp,
            )
            ids.append(memory_id)
            texts.append(blob.ciphertext)
            stamps.append(stamp)
        return cls(ids, texts, stamps, keys.hmac_key, unpadded)

    def mean_ciphertext_chars(self) -> float:
        """Mean base64 characters of a ciphertext."""
        return sum(map(len, self.ciphertexts)) / self.size

    def padding_overhead(self) -> float:
        """Stored ciphertext characters padded / unpadded - 1 (PROTOCOL §16, issue 16)."""
        return sum(map(len, self.ciphertexts)) / self.unpadded_chars - 1.0

    def memory_id(self, index: int) -> str:
        """The memory id of blob `index`; past the corpus size, ids get a cycle suffix."""
        base = self.memory_ids[index % self.size]
        cycle = index // self.size
        return base if cycle == 0 else f"{base}.{cycle}"

    def envelope(self, index: int, *, vault_id: str, device_id: str, clock: int) -> SyncBlob:
        """Blob `index` for a vault, with its real HMAC."""
        memory_id = self.memory_id(index)
        ciphertext = self.ciphertexts[index % self.size]
        created_at = self.created_at[index % self.size]
        mac = blob_hmac(
            self.hmac_key,
            vault_id=vault_id,
            memory_id=memory_id,
            device_id=device_id,
            vector_clock=clock,
            ciphertext=ciphertext,
            deleted=False,
            created_at=created_at,
        )
        return SyncBlob(
            vault_id=vault_id,
            memory_id=memory_id,
            device_id=device_id,
            vector_clock=clock,
            ciphertext=ciphertext,
            hmac=b64encode_std(mac),
            created_at=created_at,
            deleted=False,
        )

    def batches(
        self, *, vault_id: str, device_id: str, start: int, count: int, batch: int
    ) -> Iterator[list[SyncBlob]]:
        """Blobs start..start+count-1 for a vault in batches; blob i carries clock i+1."""
        for first in range(start, start + count, batch):
            last = min(first + batch, start + count)
            yield [
                self.envelope(i, vault_id=vault_id, device_id=device_id, clock=i + 1)
                for i in range(first, last)
            ]

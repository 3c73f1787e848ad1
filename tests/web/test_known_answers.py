"""The web vault's crypto in a real Chromium against the Python reference (issue 34; PROTOCOL
§2, §3, §4, §16): the page's Argon2id, HMAC and AES-GCM give the golden values the Python tests
use, a blob the Python client seals opens in the page, and a blob the page seals opens with
shared_format, byte-exact on the 8 wire fields and on the padded plaintext."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.padding import pad_plaintext
from engram_sync.shared_format.plaintext import (
    MemoryPlaintext,
    Tombstone,
    decode_plaintext,
    encode_memory,
    tombstone_plaintext,
)
from engram_sync.shared_format.sync_keys import SyncKeys, derive_sync_keys
from engram_sync.shared_format.wire import SyncBlob, decode_json, encode_json
from tests.shared_format.conftest import GOLDEN_PASSPHRASE
from tests.shared_format.test_blob import GOLDEN, GOLDEN_DELETED, GOLDEN_LIVE
from tests.shared_format.test_padding import GOLDEN_LENGTHS
from tests.web.conftest import BrowserThread, open_bundle

VAULT_ID_V1 = "f12cfc020e8f2617d25e815aac10ac29b9976567614222be954e44cbef329684"
VAULT_ID_V2 = "f3cdfd36920cb64e4aa8836cf44fb385c0285360fdf6ebee7f12eac5bd86e511"
CONTENT = 'café 🙂 line\nnext\t"quoted" back\\slash \x01 </script>'

# The page's modules, loaded once per call (same origin, so import() resolves them).
_IMPORTS = """
  const kdf = await import('./js/kdf.js');
  const blob = await import('./js/blob.js');
  const b64 = await import('./js/b64.js');
  const plain = await import('./js/plaintext.js');
  const padding = await import('./js/padding.js');
  const keys = await kdf.deriveSyncKeys(passphrase);
"""


def evaluate(browser: BrowserThread, url: str, script: str, arg: Any = None) -> Any:
    """`script` (a function of one argument) evaluated in a page on the served bundle."""
    return browser.run(lambda page: open_bundle(page, url).evaluate(script, arg))


def in_page(browser: BrowserThread, url: str, body: str, arg: Any = None) -> Any:
    """Run `body` (an async function body with `arg`, the modules and the golden keys)."""
    script = f"async ([passphrase, arg]) => {{ {_IMPORTS} {body} }}"
    return evaluate(browser, url, script, [GOLDEN_PASSPHRASE, arg])


@pytest.fixture(scope="module")
def golden_keys() -> SyncKeys:
    return derive_sync_keys(GOLDEN_PASSPHRASE)


def test_the_page_derives_the_golden_vault_ids(browser: BrowserThread, bundle_url: str) -> None:
    ids = evaluate(
        browser,
        bundle_url,
        """async (passphrase) => {
          const kdf = await import('./js/kdf.js');
          return [await kdf.vaultIdV1(passphrase), await kdf.vaultIdV2(passphrase)];
        }""",
        GOLDEN_PASSPHRASE,
    )
    assert ids == [VAULT_ID_V1, VAULT_ID_V2]


def test_the_page_keys_give_the_golden_hmacs_and_cannot_be_exported(
    browser: BrowserThread, bundle_url: str
) -> None:
    result = in_page(
        browser,
        bundle_url,
        """
        const live = b64.b64encode(await blob.blobHmac(keys.mac, {...arg, deleted: false}));
        const dead = b64.b64encode(await blob.blobHmac(keys.mac, {...arg, deleted: true}));
        let exported = 'refused';
        try { await crypto.subtle.exportKey('raw', keys.enc); exported = 'exported'; }
        catch (e) { exported = e.name; }
        return {live, dead, exported, extractable: [keys.enc.extractable, keys.mac.extractable],
                usages: [keys.enc.usages, keys.mac.usages]};
        """,
        GOLDEN,
    )
    assert result["live"] == GOLDEN_LIVE
    assert result["dead"] == GOLDEN_DELETED
    assert result["extractable"] == [False, False]
    assert result["exported"] == "InvalidAccessError"
    assert result["usages"] == [["encrypt", "decrypt"], ["sign", "verify"]]


def test_the_page_pads_to_the_golden_padme_lengths(browser: BrowserThread, bundle_url: str) -> None:
    lengths = [length for length, _ in GOLDEN_LENGTHS]
    padded = evaluate(
        browser,
        bundle_url,
        """async (lengths) => {
          const padding = await import('./js/padding.js');
          return lengths.map((n) => padding.padmeLength(n));
        }""",
        lengths,
    )
    assert padded == [p for _, p in GOLDEN_LENGTHS]


def _python_memory() -> MemoryPlaintext:
    return MemoryPlaintext(
        id="mem_0b7c2d4e-aaaa-4b", content=CONTENT, layer="semantic", scope="moment",
        content_type="text", source="user", privacy_level="cloud_first",
        context={"tool": {"name": "x", "n": 1}}, created_at="2026-08-30T12:00:00.000001+00:00",
        modified_at="2026-08-30T12:00:01.000001+00:00", last_retrieved=None, occurred_at=None,
        project="web", tags=["a", "b"], strength=1.5, valence=-0.25, retrievals=3,
        imagined=False, grounded=True, links=[], embedding=[0.5, 1.0, -2.0],
        embedding_model="m",
    )  # fmt: skip


def test_python_blobs_open_in_the_page_and_a_tampered_one_is_refused(
    browser: BrowserThread, bundle_url: str, golden_keys: SyncKeys
) -> None:
    cipher = BlobCipher(golden_keys)
    memory = _python_memory()
    live = cipher.seal(
        pad_plaintext(encode_memory(memory)), vault_id="team-web", memory_id=memory.id,
        device_id="py-device", vector_clock=5, deleted=False,
    )  # fmt: skip
    dead = cipher.seal(
        pad_plaintext(tombstone_plaintext("mem_gone")), vault_id="team-web",
        memory_id="mem_gone", device_id="py-device", vector_clock=6, deleted=True,
    )  # fmt: skip
    wire = [json.loads(encode_json(b)) for b in (live, dead)]
    tampered = dict(wire[0], vector_clock=wire[0]["vector_clock"] + 1)
    result = in_page(
        browser,
        bundle_url,
        """
        const opened = [];
        for (const b of arg.blobs) {
          const text = await blob.open(keys, b);
          opened.push({text, decoded: plain.decodePlaintext(text, b.memory_id)});
        }
        let refused = null;
        try { await blob.open(keys, arg.tampered); } catch (e) { refused = e.kind; }
        return {opened, refused};
        """,
        {"blobs": wire, "tampered": tampered},
    )
    assert result["opened"][0]["text"] == cipher.open(live)
    decoded = result["opened"][0]["decoded"]
    assert decoded["content"] == CONTENT
    assert (decoded["strength"], decoded["valence"], decoded["tags"]) == (1.5, -0.25, ["a", "b"])
    assert result["opened"][1]["decoded"] == {"tombstone": True, "id": "mem_gone"}
    assert result["refused"] == "tampered"


def test_page_blobs_open_with_python_byte_exact(
    browser: BrowserThread, bundle_url: str, golden_keys: SyncKeys
) -> None:
    result = in_page(
        browser,
        bundle_url,
        """
        const memory = plain.newMemory('mem_5e1f0c2a-bbbb-4c', arg.content,
          {tags: ['web', 'x'], project: 'p', now: '2026-08-30T12:00:00.123000+00:00'});
        memory.valence = 0.25;
        memory.embedding = [1, 0.5];
        const fields = {vault_id: 'team-web', device_id: 'page-device', deleted: false,
          created_at: '2026-08-30T12:00:00.123000+00:00'};
        const live = await blob.seal(keys, padding.padPlaintext(plain.encodeMemory(memory)),
          {...fields, memory_id: memory.id, vector_clock: 7});
        const dead = await blob.seal(keys, padding.padPlaintext(plain.tombstonePlaintext(
          'mem_gone')), {...fields, memory_id: 'mem_gone', vector_clock: 8, deleted: true});
        return [JSON.stringify(live), JSON.stringify(dead)];
        """,
        {"content": CONTENT},
    )
    cipher = BlobCipher(golden_keys)
    live, dead = (decode_json(text, SyncBlob) for text in result)
    assert [encode_json(live).decode(), encode_json(dead).decode()] == result  # 8 fields, exact
    text = cipher.open(live)  # HMAC verified under the golden hmac_key, AES-GCM under enc_key
    memory = decode_plaintext(text, expected_id="mem_5e1f0c2a-bbbb-4c")
    assert isinstance(memory, MemoryPlaintext)
    assert text == pad_plaintext(encode_memory(memory))  # msgspec's own bytes, padding too
    assert (memory.content, memory.tags, memory.valence) == (CONTENT, ["web", "x"], 0.25)
    assert memory.embedding == [1.0, 0.5]
    assert cipher.open(dead) == pad_plaintext(tombstone_plaintext("mem_gone"))
    assert decode_plaintext(cipher.open(dead)) == Tombstone(id="mem_gone")

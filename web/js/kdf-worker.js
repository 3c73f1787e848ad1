// The Argon2id derivations of PROTOCOL §2 off the page's thread (a classic Worker: hash-wasm's
// UMD build defines self.hashwasm). The raw output never leaves this worker: it is imported as a
// non-extractable CryptoKey, the bytes are zeroed, and only the CryptoKey is posted back. The
// one exception is a derived vault id (public: it names the vault on the relay), posted as hex,
// and the §13 login secret (account-kdf.js: what the relay gets instead of the password).
// "aes-state" also derives the device-state key (ours, docs/web-vault.md "Device across
// reloads"): HKDF-SHA256 of the enc key's Argon2id output, empty salt, info STATE_INFO, an
// AES-256-GCM key separated from the vault's keys by its label; non-extractable as well.
// "wrap-k" (passkey unlock of a passphrase vault, passkey-vault.js): both §2 derivations, K =
// enc ‖ hmac ‖ UTF-8(vault_id) (PROTOCOL §13's layout) sealed under the passkey's wrap key
// (a non-extractable CryptoKey posted in) and zeroed here; only the envelope and an HMAC of
// the page's challenge (the passphrase check) are posted back, never K.
/* global hashwasm */
"use strict";
importScripts("../vendor/hash-wasm-argon2.umd.min.js");

async function domainSalt(tag) {
  // PROTOCOL §2: salt = the first 16 raw bytes of SHA-256(tag)
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(tag));
  return new Uint8Array(digest).slice(0, 16);
}

async function argon2id(passphrase, salt, memoryKib, iterations, parallelism) {
  return hashwasm.argon2id({
    password: new TextEncoder().encode(passphrase), // raw UTF-8, no normalisation
    salt,
    parallelism,
    iterations,
    memorySize: memoryKib,
    hashLength: 32,
    outputType: "binary",
  });
}

const STATE_INFO = "engram-web-device-state-v1";

async function stateKey(raw) {
  const material = await crypto.subtle.importKey("raw", raw, "HKDF", false, ["deriveKey"]);
  return crypto.subtle.deriveKey(
    { name: "HKDF", hash: "SHA-256", salt: new Uint8Array(0),
      info: new TextEncoder().encode(STATE_INFO) },
    material, { name: "AES-GCM", length: 256 }, false, ["encrypt", "decrypt"]);
}

const IMPORT = {
  aes: (raw) => crypto.subtle.importKey("raw", raw, { name: "AES-GCM" }, false,
    ["encrypt", "decrypt"]),
  hmac: (raw) => crypto.subtle.importKey("raw", raw, { name: "HMAC", hash: "SHA-256" }, false,
    ["sign", "verify"]),
  // PROTOCOL §13: the wrap key of A opens (unwrapKey) the envelope of A and nothing else
  unwrap: (raw) => crypto.subtle.importKey("raw", raw, { name: "AES-GCM" }, false, ["unwrapKey"]),
};

function b64url(raw) {
  const text = btoa(String.fromCharCode(...raw));
  return text.replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function b64std(raw) {
  let text = "";
  for (const byte of raw) text += String.fromCharCode(byte);
  return btoa(text);
}

async function wrapK({ passphrase, tags, memoryKib, vaultId, wrapKey, challenge }) {
  const halves = [];
  let k = null;
  try {
    for (const tag of tags) {
      halves.push(await argon2id(passphrase, await domainSalt(tag), memoryKib, 3, 4));
    }
    const name = new TextEncoder().encode(vaultId);
    k = new Uint8Array(64 + name.length);
    k.set(halves[0]);
    k.set(halves[1], 32);
    k.set(name, 64);
    const nonce = crypto.getRandomValues(new Uint8Array(12)); // §13 envelope: nonce ‖ AES-GCM
    const sealed = new Uint8Array(await crypto.subtle.encrypt({ name: "AES-GCM", iv: nonce },
      wrapKey, k));
    const envelope = new Uint8Array(12 + sealed.length);
    envelope.set(nonce);
    envelope.set(sealed, 12);
    const mac = await IMPORT.hmac(halves[1]);
    const check = new Uint8Array(await crypto.subtle.sign("HMAC", mac, challenge));
    return { wrapped: b64std(envelope), check };
  } finally {
    k?.fill(0);
    for (const half of halves) half.fill(0);
  }
}

self.onmessage = async (event) => {
  const { id, passphrase, tag, memoryKib, use, salt, iterations = 3, parallelism = 4 } = event.data;
  try {
    if (use === "wrap-k") {
      self.postMessage({ id, result: await wrapK(event.data) });
      return;
    }
    const raw = await argon2id(passphrase, salt ?? await domainSalt(tag), memoryKib, iterations,
      parallelism);
    let result;
    if (use === "aes-state") {
      result = { enc: await IMPORT.aes(raw), state: await stateKey(raw) };
    } else if (use === "hex") {
      result = Array.from(raw, (b) => b.toString(16).padStart(2, "0")).join("");
    } else if (use === "b64url") {
      result = b64url(raw);
    } else {
      result = await IMPORT[use](raw);
    }
    raw.fill(0);
    self.postMessage({ id, result });
  } catch (e) {
    self.postMessage({ id, error: String(e && e.message ? e.message : e) });
  }
};

// Sealing and opening blobs (PROTOCOL §3), as shared_format/blob.py, through WebCrypto:
// ciphertext = base64(nonce(12) ‖ AES-256-GCM(enc_key, nonce, plaintext)), no AAD;
// hmac = base64(HMAC-SHA256(hmac_key, vault_id ‖ memory_id ‖ device_id ‖ u64le(clock) ‖
// ascii(ciphertext text) ‖ deleted byte ‖ created_at)). Opening verifies the HMAC first
// (WebCrypto's verify), then decodes, then decrypts. `keys` = {enc, mac}: non-extractable
// CryptoKeys (kdf.js).

import { b64decode, b64encode, Base64Error } from "./b64.js";
import { nowRfc3339 } from "./timestamps.js";

export const NONCE_LEN = 12;
export const MIN_CIPHERTEXT_BYTES = 28; // nonce + tag (PROTOCOL §6 step 1)
const HMAC_LEN = 32;
const ASCII = /^[\x00-\x7f]*$/;
const WELL_FORMED = (s) => typeof s === "string" && s.isWellFormed();

export class BlobError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind; // "malformed" | "tampered" | "decrypt"
  }
}

function u64le(clock) {
  // JSON numbers are exact only below 2^53: a larger clock cannot be verified here.
  if (!Number.isSafeInteger(clock) || clock < 0) {
    throw new BlobError("malformed", "vector_clock is not an integer in 0..2^53-1");
  }
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt(clock), true);
  return out;
}

/** The bytes the HMAC of §3 covers. */
export function hmacInput(b) {
  for (const name of ["vault_id", "memory_id", "device_id", "created_at"]) {
    if (!WELL_FORMED(b[name])) throw new BlobError("malformed", `${name} is not valid text`);
  }
  if (typeof b.ciphertext !== "string" || !ASCII.test(b.ciphertext)) {
    throw new BlobError("malformed", "ciphertext is not ASCII base64 text");
  }
  if (typeof b.deleted !== "boolean") throw new BlobError("malformed", "deleted is not a bool");
  const enc = new TextEncoder();
  const parts = [
    enc.encode(b.vault_id), enc.encode(b.memory_id), enc.encode(b.device_id),
    u64le(b.vector_clock), enc.encode(b.ciphertext), Uint8Array.of(b.deleted ? 1 : 0),
    enc.encode(b.created_at),
  ];
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

export async function blobHmac(macKey, fields) {
  return new Uint8Array(await crypto.subtle.sign("HMAC", macKey, hmacInput(fields)));
}

/** Encrypt and authenticate one plaintext; the 8 wire fields in the order Python writes them. */
export async function seal(keys, plaintext, { vault_id, memory_id, device_id, vector_clock,
  deleted, created_at }) {
  if (!WELL_FORMED(plaintext)) throw new BlobError("malformed", "plaintext is not valid text");
  const stamp = created_at ?? nowRfc3339();
  const nonce = crypto.getRandomValues(new Uint8Array(NONCE_LEN));
  const sealed = new Uint8Array(await crypto.subtle.encrypt(
    { name: "AES-GCM", iv: nonce }, keys.enc, new TextEncoder().encode(plaintext)));
  const raw = new Uint8Array(NONCE_LEN + sealed.length);
  raw.set(nonce);
  raw.set(sealed, NONCE_LEN);
  const blob = { vault_id, memory_id, device_id, vector_clock, ciphertext: b64encode(raw),
    hmac: "", created_at: stamp, deleted };
  blob.hmac = b64encode(await blobHmac(keys.mac, blob));
  return blob;
}

/** Verify → decode → decrypt (§3); the UTF-8 plaintext, or a BlobError and nothing. */
export async function open(keys, blob) {
  let claimed;
  try {
    claimed = b64decode(blob.hmac);
  } catch (e) {
    if (e instanceof Base64Error) throw new BlobError("tampered", "hmac is not valid base64");
    throw e;
  }
  if (claimed.length !== HMAC_LEN) {
    throw new BlobError("tampered", `hmac decodes to ${claimed.length} bytes, not 32`);
  }
  const ok = await crypto.subtle.verify("HMAC", keys.mac, claimed, hmacInput(blob));
  if (!ok) throw new BlobError("tampered", "HMAC mismatch: sealed under other keys or modified");
  let raw;
  try {
    raw = b64decode(blob.ciphertext);
  } catch {
    throw new BlobError("malformed", "ciphertext is not valid base64");
  }
  if (raw.length < MIN_CIPHERTEXT_BYTES) {
    throw new BlobError("malformed", `ciphertext is ${raw.length} bytes, shorter than 28`);
  }
  let plain;
  try {
    plain = await crypto.subtle.decrypt(
      { name: "AES-GCM", iv: raw.subarray(0, NONCE_LEN) }, keys.enc, raw.subarray(NONCE_LEN));
  } catch {
    throw new BlobError("decrypt", "AES-GCM tag did not verify: encrypted under another key");
  }
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(plain);
  } catch {
    throw new BlobError("malformed", "decrypted plaintext is not UTF-8");
  }
}

// Passkey unlock's keys (docs/web-vault.md "Passkey unlock", our addition to PROTOCOL §13):
// the WebAuthn PRF output, evaluated with a random 32-byte salt of ours (`prf_salt`, public),
// goes through HKDF-SHA256 (salt = prf_salt) into two non-extractable AES-256-GCM keys:
// "engram-passkey-wrap-v1" wraps K in the §13 envelope (nonce(12) ‖ AES-256-GCM, no AAD),
// stored on the relay; "engram-passkey-session-v1" seals the account session token the page
// keeps in localStorage. The PRF output is zeroed once imported; the relay never sees it.

import { b64decode, b64encode } from "./b64.js";

export const PRF_SALT_LEN = 32;
export const WRAP_INFO = "engram-passkey-wrap-v1";
export const SESSION_INFO = "engram-passkey-session-v1";
const NONCE_LEN = 12;

/** {wrap, session}: AES-256-GCM CryptoKeys (extractable: false) from the PRF output. */
export async function passkeyKeys(prfOutput, prfSalt) {
  const bytes = new Uint8Array(prfOutput);
  const ikm = await crypto.subtle.importKey("raw", bytes, "HKDF", false, ["deriveKey"]);
  bytes.fill(0);
  const key = (info) => crypto.subtle.deriveKey(
    { name: "HKDF", hash: "SHA-256", salt: prfSalt, info: new TextEncoder().encode(info) },
    ikm, { name: "AES-GCM", length: 256 }, false, ["encrypt", "decrypt"]);
  const [wrap, session] = await Promise.all([key(WRAP_INFO), key(SESSION_INFO)]);
  return { wrap, session };
}

/** base64(nonce(12) ‖ AES-256-GCM(key, bytes)), no AAD: the §13 envelope. */
export async function sealBytes(key, bytes) {
  const nonce = crypto.getRandomValues(new Uint8Array(NONCE_LEN));
  const sealed = new Uint8Array(await crypto.subtle.encrypt({ name: "AES-GCM", iv: nonce }, key,
    bytes));
  const out = new Uint8Array(NONCE_LEN + sealed.length);
  out.set(nonce);
  out.set(sealed, NONCE_LEN);
  return b64encode(out);
}

/** The bytes of a sealBytes envelope; throws when it does not open. */
export async function openBytes(key, text) {
  const raw = b64decode(text);
  return new Uint8Array(await crypto.subtle.decrypt(
    { name: "AES-GCM", iv: raw.subarray(0, NONCE_LEN) }, key, raw.subarray(NONCE_LEN)));
}

export function b64url(bytes) {
  return b64encode(bytes).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

export function fromB64url(text) {
  const std = text.replace(/-/g, "+").replace(/_/g, "/");
  return b64decode(std + "=".repeat((4 - (std.length % 4)) % 4));
}

// The account layer in the page (PROTOCOL §13, as client/_accounts/account.py and
// shared_format/wraps.py, login.py): the login secret sent instead of the password, the wrap
// key of A (Argon2id m=65536, t=3, p=4 in a Worker), A opened as a non-extractable CryptoKey
// (it never exists as bytes in the page), and K opened under A with its vault_id suffix
// checked. The password and A never leave the page; K's bytes live only while they are
// imported as the non-extractable enc and hmac keys, then are zeroed.

import { b64decode, Base64Error } from "./b64.js";
import { STATE_INFO } from "./device-state.js";
import { derive } from "./kdf.js";
import { Relay } from "./relay.js";

const LOGIN_SALT_TAG = "engram-login-v1:"; // shared_format/login.py
const LOGIN = { memoryKib: 19456, iterations: 2, parallelism: 1 };
const WRAP = { memoryKib: 65536, iterations: 3, parallelism: 4 }; // PROTOCOL §13
const NONCE_LEN = 12;
const TAG_LEN = 16;
const HALF = 32;
const ENVELOPE_A_LEN = NONCE_LEN + HALF + TAG_LEN; // 60
const MIN_SALT = 16;
const MAX_SALT = 64;
const MAX_WRAP = 512;

/** A wrap that fails to open, or opens to another vault's key: refused, nothing used. */
export class WrapRefused extends Error {}

export function normalEmail(email) {
  return email.trim().toLowerCase();
}

async function loginSalt(email) {
  const tag = new TextEncoder().encode(LOGIN_SALT_TAG + normalEmail(email));
  return new Uint8Array(await crypto.subtle.digest("SHA-256", tag)).slice(0, 16);
}

/** What the relay gets as `password` (shared_format/login.py): never the password itself. */
export async function loginSecret(password, email) {
  return derive(password, null, LOGIN.memoryKib, "b64url",
    { salt: await loginSalt(email), iterations: LOGIN.iterations, parallelism: LOGIN.parallelism });
}

function field(text, what, lo, hi) {
  let raw;
  try {
    raw = b64decode(text);
  } catch (e) {
    if (e instanceof Base64Error) throw new WrapRefused(`the relay sent a malformed ${what}`);
    throw e;
  }
  if (raw.length < lo || raw.length > hi) {
    throw new WrapRefused(`the relay sent a ${what} of ${raw.length} bytes, not ${lo}..${hi}`);
  }
  return raw;
}

/** A as a non-extractable AES-GCM CryptoKey (decrypt: K; encrypt: none needed here). */
export async function openAccountKey(password, wrappedA, saltPw) {
  const envelope = field(wrappedA, "password wrap", ENVELOPE_A_LEN, ENVELOPE_A_LEN);
  const salt = field(saltPw, "password salt", MIN_SALT, MAX_SALT);
  const wrapKey = await derive(password, null, WRAP.memoryKib, "unwrap",
    { salt, iterations: WRAP.iterations, parallelism: WRAP.parallelism });
  try {
    return await crypto.subtle.unwrapKey("raw", envelope.subarray(NONCE_LEN), wrapKey,
      { name: "AES-GCM", iv: envelope.subarray(0, NONCE_LEN) }, { name: "AES-GCM" }, false,
      ["decrypt"]);
  } catch {
    throw new WrapRefused("the account password does not open the account key");
  }
}

/** K = enc(32) ‖ hmac(32) ‖ UTF-8(vault_id) opened under `key` (A, or a passkey's wrap key):
 * its bytes, vault_id suffix checked. The caller zeroes them. */
export async function openVaultKeyBytes(key, wrappedK, vaultId, what = "account key") {
  const envelope = field(wrappedK, "vault wrap", NONCE_LEN + 2 * HALF + 1 + TAG_LEN, MAX_WRAP);
  let k;
  try {
    k = new Uint8Array(await crypto.subtle.decrypt(
      { name: "AES-GCM", iv: envelope.subarray(0, NONCE_LEN) }, key, envelope.subarray(NONCE_LEN)));
  } catch {
    throw new WrapRefused(`the relay's wrap of vault ${vaultId} does not open with the ${what}: ` +
      "refused, nothing was used");
  }
  let named;
  try {
    named = new TextDecoder("utf-8", { fatal: true }).decode(k.subarray(2 * HALF));
  } catch {
    named = null;
  }
  if (named !== vaultId) { // PROTOCOL §13: on unwrap, check the vault_id suffix
    k.fill(0);
    throw new WrapRefused(`the relay's wrap for vault ${vaultId} holds the key of another ` +
      "vault: refused, nothing was used");
  }
  return k;
}

/** {enc, mac}: the sync keys of K as non-extractable CryptoKeys; K's bytes are zeroed. */
/** The device-state key (device-state.js) from K's enc half: the key the passphrase path
 * derives in kdf-worker.js (HKDF-SHA256 of the enc key's bytes, empty salt, info STATE_INFO),
 * so a vault opened by passphrase, account or passkey is the same device in this browser. */
async function deviceStateKey(raw) {
  try {
    const material = await crypto.subtle.importKey("raw", raw, "HKDF", false, ["deriveKey"]);
    return await crypto.subtle.deriveKey(
      { name: "HKDF", hash: "SHA-256", salt: new Uint8Array(0),
        info: new TextEncoder().encode(STATE_INFO) },
      material, { name: "AES-GCM", length: 256 }, false, ["encrypt", "decrypt"]);
  } finally {
    raw.fill(0);
  }
}

export async function importVaultKey(k) {
  try {
    const [enc, mac, state] = await Promise.all([
      crypto.subtle.importKey("raw", k.slice(0, HALF), { name: "AES-GCM" }, false,
        ["encrypt", "decrypt"]),
      crypto.subtle.importKey("raw", k.slice(HALF, 2 * HALF), { name: "HMAC", hash: "SHA-256" },
        false, ["sign", "verify"]),
      deviceStateKey(k.slice(0, HALF)),
    ]);
    return { enc, mac, state };
  } finally {
    k.fill(0);
  }
}

/** The account routes the page uses (PROTOCOL §13), through `engram-sync web`'s proxy. */
export class AccountRelay extends Relay {
  static async signin(email, secret, base = "") {
    const anonymous = new Relay("", base);
    anonymous.headers = {};
    return anonymous.request("POST", "/auth/signin", { email: normalEmail(email), password: secret });
  }

  wraps() {
    return this.request("GET", "/account/wraps");
  }

  vaultWrap(vaultId) {
    return this.request("GET", `/account/vaults/${encodeURIComponent(vaultId)}/wrap`);
  }

  /** A vault key bound to the page's device (PROTOCOL §10, §13), shown once. */
  mintKey(vaultId, deviceId, label) {
    return this.request("POST", "/account/keys", { vault_id: vaultId, device_id: deviceId, label });
  }
}

/** Sign in, open A and K: {session, accountKey, wrappedK, keys}. Throws WrapRefused or
 * RelayError; the password is only fed to Argon2id here. */
export async function accountUnlock(email, password, vaultId) {
  const secret = await loginSecret(password, email);
  const issued = await AccountRelay.signin(email, secret);
  const relay = new AccountRelay(issued.session_token);
  const wraps = await relay.wraps();
  if (typeof wraps.wrapped_a !== "string" || typeof wraps.salt_pw !== "string") {
    throw new WrapRefused("this account has no password wrap of its key on the relay");
  }
  const accountKey = await openAccountKey(password, wraps.wrapped_a, wraps.salt_pw);
  const wrap = await relay.vaultWrap(vaultId);
  if (typeof wrap.wrapped_k !== "string") throw new WrapRefused("the relay sent no vault wrap");
  const keys = await importVaultKey(await openVaultKeyBytes(accountKey, wrap.wrapped_k, vaultId));
  return { relay, session: issued, accountKey, wrappedK: wrap.wrapped_k, keys };
}

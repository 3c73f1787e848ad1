// Sync keys from a passphrase (PROTOCOL §2), each Argon2id derivation in its own Worker
// (kdf-worker.js) so the page never freezes and the two keys derive in parallel. What comes
// back are non-extractable CryptoKeys (the vault id alone is hex: it is public).

export const ENC_TAG = "axiom-sync-enc-v2";
export const HMAC_TAG = "axiom-sync-hmac-v2";
export const VAULT_ID_V2_TAG = "axiom-sync-vaultid-v2";
export const VAULT_ID_V1_TAG = "axiom-sync-vaultid-v1";
const KEY_MEMORY_KIB = 65536;
const VAULT_ID_V2_MEMORY_KIB = 98304;
const VAULT_ID_V1_MEMORY_KIB = 65536;
const WORKER_URL = new URL("./kdf-worker.js", import.meta.url);

let nextId = 0;

/** One Argon2id in a Worker; `extra` = {salt, iterations, parallelism} for other than §2's. */
export function derive(passphrase, tag, memoryKib, use, extra = {}) {
  return new Promise((resolve, reject) => {
    const worker = new Worker(WORKER_URL); // classic: importScripts of the vendored UMD build
    const id = ++nextId;
    worker.onmessage = (event) => {
      worker.terminate();
      if (event.data.id !== id) return reject(new Error("key derivation answered out of turn"));
      if (event.data.error) return reject(new Error(`key derivation failed: ${event.data.error}`));
      return resolve(event.data.result);
    };
    worker.onerror = (event) => {
      worker.terminate();
      reject(new Error(`key derivation worker failed: ${event.message || "unknown error"}`));
    };
    worker.postMessage({ id, passphrase, tag, memoryKib, use, ...extra });
  });
}

/** {enc, mac, state}: AES-256-GCM and HMAC-SHA256 CryptoKeys, and the device-state key
 * (AES-256-GCM, HKDF of the enc derivation: device-state.js), all extractable: false. */
export async function deriveSyncKeys(passphrase) {
  const [{ enc, state }, mac] = await Promise.all([
    derive(passphrase, ENC_TAG, KEY_MEMORY_KIB, "aes-state"),
    derive(passphrase, HMAC_TAG, KEY_MEMORY_KIB, "hmac"),
  ]);
  return { enc, mac, state };
}

export function vaultIdV2(passphrase) {
  return derive(passphrase, VAULT_ID_V2_TAG, VAULT_ID_V2_MEMORY_KIB, "hex");
}

export function vaultIdV1(passphrase) {
  return derive(passphrase, VAULT_ID_V1_TAG, VAULT_ID_V1_MEMORY_KIB, "hex");
}

/** For "Add a passkey" on a passphrase vault (passkey-vault.js): K = enc ‖ hmac ‖
 * UTF-8(vault_id) (PROTOCOL §13's layout, the two §2 derivations) rebuilt, sealed under
 * `wrapKey` (the §13 envelope) and zeroed, all inside the worker: {wrapped (base64), check
 * (HMAC-SHA256 of `challenge` under the hmac half, proving the passphrase is the vault's)}. */
export function wrapSyncKeyBytes(passphrase, vaultId, wrapKey, challenge) {
  return derive(passphrase, null, KEY_MEMORY_KIB, "wrap-k",
    { tags: [ENC_TAG, HMAC_TAG], vaultId, wrapKey, challenge });
}

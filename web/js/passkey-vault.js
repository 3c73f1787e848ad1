// Passkey unlock of a passphrase vault (docs/web-vault.md "Passkey unlock"; our addition to
// PROTOCOL §13, as for accounts). There is no account: the wrap of K (§13 layout enc ‖ hmac ‖
// vault_id) lives on the relay under the vault's API-key auth (PUT/GET/DELETE
// /v1/vaults/{v}/passkeys/{credential_id}), and the page keeps in localStorage {vault_id,
// credential_id, prf_salt, sealed_api_key}: the API key sealed under the passkey's session key.
// "Add a passkey" asks the passphrase again: K's bytes are rebuilt, wrapped and zeroed inside
// the KDF worker (kdf.js wrapSyncKeyBytes), which also proves the passphrase is this vault's
// (an HMAC of a fresh challenge, verified with the unlocked mac key). The page never holds K.

import { importVaultKey, openVaultKeyBytes, WrapRefused } from "./account.js";
import { b64decode, b64encode } from "./b64.js";
import { wrapSyncKeyBytes } from "./kdf.js";
import { Relay, RelayError } from "./relay.js";
import { openBytes, passkeyKeys, sealBytes } from "./passkey-crypto.js";
import { prfOutput, register } from "./passkey-webauthn.js";

function passkeyPath(vaultId, credentialId) {
  return `/v1/vaults/${encodeURIComponent(vaultId)}/passkeys/${credentialId}`;
}

/** Add a passkey to the unlocked passphrase vault `ctx` {relay, apiKey, vaultId, keys}:
 * the wrap on the relay, and the entry to keep here (returned). */
export async function addVaultPasskey(ctx, passphrase) {
  const challenge = crypto.getRandomValues(new Uint8Array(32));
  const { credentialId, prfSalt, keys } = await register(`vault ${ctx.vaultId.slice(0, 16)}`);
  const { wrapped, check } = await wrapSyncKeyBytes(passphrase, ctx.vaultId, keys.wrap,
    challenge);
  if (!await crypto.subtle.verify("HMAC", ctx.keys.mac, check, challenge)) {
    throw new WrapRefused("this passphrase is not the unlocked vault's: no passkey was added");
  }
  await ctx.relay.request("PUT", passkeyPath(ctx.vaultId, credentialId),
    { wrapped_k: wrapped, prf_salt: b64encode(prfSalt) });
  const apiKey = new TextEncoder().encode(ctx.apiKey);
  try {
    return { credentialId, entry: { vault_id: ctx.vaultId, credential_id: credentialId,
      prf_salt: b64encode(prfSalt), sealed_api_key: await sealBytes(keys.session, apiKey) } };
  } finally {
    apiKey.fill(0);
  }
}

/** Remove: the wrap deleted on the relay (the vault key's auth, no passphrase needed). */
export async function removeVaultPasskey(ctx) {
  await ctx.relay.request("DELETE", passkeyPath(ctx.vaultId, ctx.credentialId));
}

/** The gesture -> the API key opened from its seal -> the wrap fetched -> K opened, its
 * vault_id checked: {keys, apiKey, relay}. */
export async function vaultPasskeyUnlock(entry) {
  const prfSalt = b64decode(entry.prf_salt);
  const output = await prfOutput(entry.credential_id, prfSalt);
  performance.mark("engram:gesture");
  const keys = await passkeyKeys(output, prfSalt);
  let apiKey;
  try {
    apiKey = new TextDecoder().decode(await openBytes(keys.session, entry.sealed_api_key));
  } catch {
    throw new WrapRefused("this passkey does not open the API key kept in this browser");
  }
  const relay = new Relay(apiKey);
  let wrap;
  try {
    wrap = await relay.request("GET", passkeyPath(entry.vault_id, entry.credential_id));
  } catch (e) {
    if (e instanceof RelayError && e.code === "no_wrap") {
      throw new WrapRefused("this passkey was removed from the vault: it unlocks nothing");
    }
    if (e instanceof RelayError && (e.status === 401 || e.status === 403)) {
      throw new WrapRefused("the API key kept for this passkey no longer works: unlock with" +
        " the passphrase and a valid key");
    }
    throw e;
  }
  const k = await openVaultKeyBytes(keys.wrap, wrap.wrapped_k, entry.vault_id, "passkey");
  return { relay, apiKey, keys: await importVaultKey(k) };
}

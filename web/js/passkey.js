// Passkey unlock (docs/web-vault.md "Passkey unlock"): after an account unlock, "Add a passkey"
// registers one with the PRF extension, wraps K under its PRF-derived key (passkey-crypto.js)
// and stores that wrap on the relay (PUT /account/vaults/{v}/passkeys/{credential_id}, the
// account password's login secret in the body as for every §13 wrap). The page keeps in
// localStorage only public values and ciphertext: email, vault id, credential id, prf_salt and
// the session token sealed under the passkey. A later unlock is the gesture alone; removing the
// passkey deletes its wrap, after which it opens nothing. A passphrase vault (no account) does
// the same through passkey-vault.js: its entry holds the API key sealed instead of a session.

import { AccountRelay, importVaultKey, loginSecret, openVaultKeyBytes, WrapRefused } from
  "./account.js";
import { b64decode, b64encode } from "./b64.js";
import { RelayError } from "./relay.js";
import { openBytes, passkeyKeys, sealBytes } from "./passkey-crypto.js";
import { addVaultPasskey, removeVaultPasskey, vaultPasskeyUnlock } from "./passkey-vault.js";
import { prfOutput, register } from "./passkey-webauthn.js";

const $ = (id) => document.getElementById(id);
const STORE = "engram-passkey"; // localStorage: one entry, public values and ciphertext only
const LABEL = "web vault (browser)";

function passkeyPath(vaultId, credentialId) {
  return `/account/vaults/${encodeURIComponent(vaultId)}/passkeys/${credentialId}`;
}

export function savedEntry() {
  try {
    const entry = JSON.parse(localStorage.getItem(STORE) ?? "null");
    return entry && typeof entry.credential_id === "string" && typeof entry.vault_id === "string"
      ? entry : null;
  } catch {
    return null;
  }
}

/** Add a passkey for the unlocked vault: its wrap of K on the relay, the entry here. */
async function addPasskey(ctx, password) {
  const secret = await loginSecret(password, ctx.email);
  const { credentialId, prfSalt, keys } = await register(ctx.email);
  const k = await openVaultKeyBytes(ctx.accountKey, ctx.wrappedK, ctx.vaultId);
  let wrapped;
  try {
    wrapped = await sealBytes(keys.wrap, k);
  } finally {
    k.fill(0);
  }
  await ctx.relay.request("PUT", passkeyPath(ctx.vaultId, credentialId),
    { wrapped_k: wrapped, prf_salt: b64encode(prfSalt), password: secret });
  const token = new TextEncoder().encode(ctx.session.session_token);
  localStorage.setItem(STORE, JSON.stringify({ email: ctx.email, vault_id: ctx.vaultId,
    credential_id: credentialId, prf_salt: b64encode(prfSalt),
    sealed_session: await sealBytes(keys.session, token) }));
  return credentialId;
}

async function removePasskey(ctx, password) {
  const secret = await loginSecret(password, ctx.email);
  await ctx.relay.request("DELETE", passkeyPath(ctx.vaultId, ctx.credentialId),
    { password: secret });
  localStorage.removeItem(STORE);
}

/** The gesture -> K -> {keys, relay}: the session opened from its seal, the wrap fetched. */
export async function passkeyUnlock(entry) {
  const prfSalt = b64decode(entry.prf_salt);
  const output = await prfOutput(entry.credential_id, prfSalt);
  performance.mark("engram:gesture");
  const keys = await passkeyKeys(output, prfSalt);
  let token;
  try {
    token = new TextDecoder().decode(await openBytes(keys.session, entry.sealed_session));
  } catch {
    throw new WrapRefused("this passkey does not open the session kept in this browser");
  }
  const relay = new AccountRelay(token);
  let wrap;
  try {
    wrap = await relay.request("GET", passkeyPath(entry.vault_id, entry.credential_id));
  } catch (e) {
    if (e instanceof RelayError && e.code === "no_wrap") {
      throw new WrapRefused("this passkey was removed from the account: it unlocks nothing");
    }
    if (e instanceof RelayError && e.status === 401) {
      throw new WrapRefused("the account session ended: unlock with the account password");
    }
    throw e;
  }
  const k = await openVaultKeyBytes(keys.wrap, wrap.wrapped_k, entry.vault_id, "passkey");
  return { relay, keys: await importVaultKey(k) };
}

/** The entry's unlock: {keys, apiKey (a key, or a minter of one per device id), ctx}. */
async function unlockWith(entry) {
  if (typeof entry.sealed_api_key === "string") { // a passphrase vault (passkey-vault.js)
    const opened = await vaultPasskeyUnlock(entry);
    return { keys: opened.keys, apiKey: opened.apiKey, ctx: { kind: "vault",
      relay: opened.relay, apiKey: opened.apiKey, keys: opened.keys, vaultId: entry.vault_id,
      credentialId: entry.credential_id } };
  }
  const opened = await passkeyUnlock(entry);
  return { keys: opened.keys,
    apiKey: async (deviceId) => (await opened.relay.mintKey(entry.vault_id, deviceId, LABEL)).key,
    ctx: { kind: "account", relay: opened.relay, email: entry.email, vaultId: entry.vault_id,
      credentialId: entry.credential_id } };
}

/** Wire the passkey unlock button and the add/remove form; returns {offer(ctx)}: ctx of an
 * account unlock {kind: "account", relay, session, accountKey, wrappedK, email, vaultId} or of
 * a passphrase one {kind: "vault", relay, apiKey, keys, vaultId}. */
export function wirePasskeys({ start, status, failed }) {
  let ctx = null;
  const entry = savedEntry();
  if (entry) {
    $("passkey-unlock").hidden = false;
    $("passkey-unlock-who").textContent = entry.email ? `${entry.email} · vault ${entry.vault_id}`
      : `vault ${entry.vault_id}`;
  }
  $("passkey-unlock").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("passkey-unlock-button");
    button.disabled = true;
    performance.clearMarks();
    performance.mark("engram:unlock");
    try {
      status("Waiting for the passkey…");
      const opened = await unlockWith(entry);
      performance.mark("engram:keys");
      await start(opened.keys, entry.vault_id, opened.apiKey);
      offer(opened.ctx);
    } catch (e) {
      failed(e, button);
    }
  });
  function offer(unlocked) {
    ctx = unlocked;
    const vault = ctx.kind === "vault";
    $("passkey").hidden = false;
    $("passkey-password-what").textContent = vault ? "Vault passphrase (to add a passkey)"
      : "Account password (to add or remove a passkey)";
    $("passkey-add-button").hidden = vault ? !ctx.keys : !ctx.accountKey;
    $("passkey-remove-button").hidden = !ctx.credentialId;
  }
  async function act(what) {
    const password = $("passkey-password").value;
    $("passkey-password").value = "";
    const vault = ctx.kind === "vault";
    try {
      if (what === "add" && vault) {
        const added = await addVaultPasskey(ctx, password);
        localStorage.setItem(STORE, JSON.stringify(added.entry));
        ctx.credentialId = added.credentialId;
      } else if (what === "add") {
        ctx.credentialId = await addPasskey(ctx, password);
      } else {
        await (vault ? removeVaultPasskey(ctx) : removePasskey(ctx, password));
        localStorage.removeItem(STORE);
        ctx.credentialId = null;
      }
      status(what === "add" ? "Passkey added: a reload unlocks with it alone"
        : "Passkey removed: it unlocks nothing now");
      offer(ctx);
    } catch (e) {
      status(`Passkey: ${e.message}`, true);
    }
  }
  $("passkey").addEventListener("submit", (event) => {
    event.preventDefault();
    act("add");
  });
  $("passkey-remove-button").addEventListener("click", () => act("remove"));
  return { offer };
}

// Passkey unlock (docs/web-vault.md "Passkey unlock"): after an account unlock, "Add a passkey"
// registers one with the PRF extension, wraps K under its PRF-derived key (passkey-crypto.js)
// and stores that wrap on the relay (PUT /account/vaults/{v}/passkeys/{credential_id}, the
// account password's login secret in the body as for every §13 wrap). The page keeps in
// localStorage only public values and ciphertext: email, vault id, credential id, prf_salt and
// the session token sealed under the passkey. A later unlock is the gesture alone; removing the
// passkey deletes its wrap, after which it opens nothing.

import { AccountRelay, importVaultKey, loginSecret, openVaultKeyBytes, WrapRefused } from
  "./account.js";
import { b64decode, b64encode } from "./b64.js";
import { RelayError } from "./relay.js";
import { b64url, fromB64url, openBytes, passkeyKeys, PRF_SALT_LEN, sealBytes } from
  "./passkey-crypto.js";

const $ = (id) => document.getElementById(id);
const STORE = "engram-passkey"; // localStorage: one entry, public values and ciphertext only
const LABEL = "web vault (browser)";

function passkeyPath(vaultId, credentialId) {
  return `/account/vaults/${encodeURIComponent(vaultId)}/passkeys/${credentialId}`;
}

export function savedEntry() {
  try {
    const entry = JSON.parse(localStorage.getItem(STORE) ?? "null");
    return entry && typeof entry.credential_id === "string" ? entry : null;
  } catch {
    return null;
  }
}

function rpId() {
  const host = location.hostname;
  if (/^[0-9.]+$/.test(host) || host.includes(":")) {
    throw new WrapRefused(`passkeys need a name, not an address: open http://localhost:` +
      `${location.port}/ instead of ${host}`);
  }
  return host;
}

/** The PRF output of `credentialId` for `prfSalt` (the gesture). */
async function prfOutput(credentialId, prfSalt) {
  const assertion = await navigator.credentials.get({ publicKey: {
    challenge: crypto.getRandomValues(new Uint8Array(32)), rpId: rpId(),
    allowCredentials: [{ type: "public-key", id: fromB64url(credentialId) }],
    userVerification: "required", extensions: { prf: { eval: { first: prfSalt } } } } });
  const first = assertion?.getClientExtensionResults().prf?.results?.first;
  if (!first) throw new WrapRefused("the passkey gave no PRF output: this authenticator cannot");
  return first;
}

async function register(email) {
  const prfSalt = crypto.getRandomValues(new Uint8Array(PRF_SALT_LEN));
  const credential = await navigator.credentials.create({ publicKey: {
    rp: { name: "Engram web vault", id: rpId() },
    user: { id: crypto.getRandomValues(new Uint8Array(16)), name: email, displayName: email },
    challenge: crypto.getRandomValues(new Uint8Array(32)),
    pubKeyCredParams: [{ type: "public-key", alg: -7 }, { type: "public-key", alg: -257 }],
    authenticatorSelection: { residentKey: "preferred", userVerification: "required" },
    extensions: { prf: { eval: { first: prfSalt } } } } });
  const prf = credential.getClientExtensionResults().prf;
  if (!prf?.enabled && !prf?.results) {
    throw new WrapRefused("this authenticator has no PRF extension: it cannot unlock a vault");
  }
  const credentialId = b64url(new Uint8Array(credential.rawId));
  const output = prf.results?.first ?? await prfOutput(credentialId, prfSalt);
  return { credentialId, prfSalt, keys: await passkeyKeys(output, prfSalt) };
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

/** Wire the passkey unlock button and the add/remove form; returns {offer(ctx)}. */
export function wirePasskeys({ start, status, failed }) {
  let ctx = null;
  const entry = savedEntry();
  if (entry) {
    $("passkey-unlock").hidden = false;
    $("passkey-unlock-who").textContent = `${entry.email} · vault ${entry.vault_id}`;
  }
  $("passkey-unlock").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("passkey-unlock-button");
    button.disabled = true;
    performance.clearMarks();
    performance.mark("engram:unlock");
    try {
      status("Waiting for the passkey…");
      const opened = await passkeyUnlock(entry);
      performance.mark("engram:keys");
      await start(opened.keys, entry.vault_id, async (deviceId) =>
        (await opened.relay.mintKey(entry.vault_id, deviceId, LABEL)).key);
      offer({ relay: opened.relay, email: entry.email, vaultId: entry.vault_id,
        credentialId: entry.credential_id });
    } catch (e) {
      failed(e, button);
    }
  });
  function offer(unlocked) {
    ctx = unlocked;
    $("passkey").hidden = false;
    $("passkey-add-button").hidden = !ctx.accountKey;
    $("passkey-remove-button").hidden = !ctx.credentialId;
  }
  async function act(what) {
    const password = $("passkey-password").value;
    $("passkey-password").value = "";
    try {
      if (what === "add") {
        ctx.credentialId = await addPasskey(ctx, password);
        status("Passkey added: a reload unlocks with it alone");
      } else {
        await removePasskey(ctx, password);
        ctx.credentialId = null;
        status("Passkey removed: it unlocks nothing now");
      }
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

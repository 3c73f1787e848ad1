// The WebAuthn ceremonies of passkey unlock (docs/web-vault.md "Passkey unlock"), shared by the
// account path (passkey.js) and the passphrase-vault path (passkey-vault.js): registering a
// passkey with the PRF extension and evaluating its PRF for a salt (the gesture). The PRF
// output goes straight into passkeyKeys (passkey-crypto.js), which zeroes it.

import { WrapRefused } from "./account.js";
import { b64url, fromB64url, passkeyKeys, PRF_SALT_LEN } from "./passkey-crypto.js";

function rpId() {
  const host = location.hostname;
  if (/^[0-9.]+$/.test(host) || host.includes(":")) {
    throw new WrapRefused(`passkeys need a name, not an address: open http://localhost:` +
      `${location.port}/ instead of ${host}`);
  }
  return host;
}

/** The PRF output of `credentialId` for `prfSalt` (the gesture). */
export async function prfOutput(credentialId, prfSalt) {
  const assertion = await navigator.credentials.get({ publicKey: {
    challenge: crypto.getRandomValues(new Uint8Array(32)), rpId: rpId(),
    allowCredentials: [{ type: "public-key", id: fromB64url(credentialId) }],
    userVerification: "required", extensions: { prf: { eval: { first: prfSalt } } } } });
  const first = assertion?.getClientExtensionResults().prf?.results?.first;
  if (!first) throw new WrapRefused("the passkey gave no PRF output: this authenticator cannot");
  return first;
}

/** A new passkey named `name`: {credentialId, prfSalt, keys: {wrap, session}}. */
export async function register(name) {
  const prfSalt = crypto.getRandomValues(new Uint8Array(PRF_SALT_LEN));
  const credential = await navigator.credentials.create({ publicKey: {
    rp: { name: "Engram web vault", id: rpId() },
    user: { id: crypto.getRandomValues(new Uint8Array(16)), name, displayName: name },
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

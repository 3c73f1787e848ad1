// The account unlock form (PROTOCOL §13; docs/web-vault.md "Account unlock"): email, password
// and vault id -> the login secret signs in -> A and K open in the page -> a vault key bound to
// the page's device is minted -> the vault is pulled as in the passphrase path. The password
// goes into Argon2id only; the relay sees the login secret at /auth/signin, never A or K.

import { accountUnlock } from "./account.js";
import { wirePasskeys } from "./passkey.js";

const $ = (id) => document.getElementById(id);
const LABEL = "web vault (browser)";

/** `start(keys, vaultId, apiKey)` opens the vault (app.js); `failed(e, button)` reports.
 * Returns the passkey form's {offer(ctx)} (passkey.js), for the passphrase unlock too. */
export function wireAccountUnlock({ start, status, failed }) {
  const passkeys = wirePasskeys({ start, status, failed });
  $("account-unlock").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = $("account-unlock-button");
    button.disabled = true;
    const email = $("account-email").value;
    const password = $("account-password").value;
    const vaultId = $("account-vault-id").value.trim();
    $("account-password").value = "";
    performance.clearMarks();
    performance.mark("engram:unlock");
    try {
      status("Signing in and opening the account's key…");
      const opened = await accountUnlock(email, password, vaultId);
      performance.mark("engram:keys");
      await start(opened.keys, vaultId, async (deviceId) =>
        (await opened.relay.mintKey(vaultId, deviceId, LABEL)).key);
      passkeys.offer({ ...opened, kind: "account", email, vaultId });
    } catch (e) {
      failed(e, button);
    }
  });
  return passkeys;
}

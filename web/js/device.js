// The page's device for one vault: the one kept across reloads when its sealed records open
// (device-state.js), else a new one. A record not trusted is reported through `problem` and
// never used; the device registers either way (the relay's roster keeps one row per id).

import { DeviceStore } from "./device-state.js";
import { WebVault } from "./vault.js";

/** `relay`: a Relay, or an async function of the device id giving one (a key minted for it). */
export async function openDevice({ keys, relay, vaultId, relayName, label, problem }) {
  const store = new DeviceStore(keys, vaultId);
  let stored = { device: null, set: null, problems: [] };
  try {
    stored = await store.load();
  } catch (e) {
    stored.problems.push(`the stored device state could not be read: ${e?.message ?? e}`);
  }
  stored.problems.forEach(problem);
  const persist = {
    device: (v) => store.save("device", v.deviceRecord()),
    set: (v) => store.save("set", v.setRecord()).catch((e) =>
      problem(`the device state could not be kept: ${e?.message ?? e}`)),
    forget: () => store.forget().catch(() => {}),
  };
  const minted = typeof relay === "function"; // a key minted for the device id (an account's)
  const vault = new WebVault({ keys, relay: minted ? null : relay, vaultId, relayName,
    label: stored.device?.label ?? label, deviceId: stored.device?.device_id,
    clock: stored.device?.clock ?? 0, persist });
  if (stored.set !== null) {
    try {
      vault.restoreSet(stored.set);
    } catch (e) {
      problem(`the stored set record was ignored: ${e.message}; pulling again`);
      Object.assign(vault, { cursor: 0, generation: null, fullPull: false, memories: new Map(), known: new Map(),
        pending: new Map(), conflicts: [] });
    }
  }
  vault.restored = stored.device !== null;
  if (!vault.restored) await persist.device(vault);
  if (minted) vault.relay = await relay(vault.deviceId);
  await vault.register();
  return vault;
}

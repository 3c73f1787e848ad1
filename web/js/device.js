// The page's device for one vault: the one kept across reloads when its sealed records open
// (device-state.js), else a new one. A record not trusted is reported through `problem` and
// never used; the device registers either way (the relay's roster keeps one row per id).

import { DeviceStore } from "./device-state.js";
import { WebVault } from "./vault.js";

export class DeviceBusy extends Error {}

/** Hold this browser's lock on the vault's device until the page goes (Lock reloads it, a
 * close ends it): two tabs of one vault would share the sealed records and the clock and
 * overwrite each other's set record. Web Locks are per origin; a browser without them is
 * not stopped. Resolves false when another tab holds the lock. */
function holdDevice(vaultId) {
  if (!navigator.locks || held.has(vaultId)) return Promise.resolve(true);
  return new Promise((resolve, reject) => {
    navigator.locks.request(`engram-web-device:${vaultId}`, { ifAvailable: true }, (lock) => {
      if (lock !== null) held.add(vaultId); // a second unlock in this tab keeps it
      resolve(lock !== null);
      return lock === null ? undefined : new Promise(() => {}); // never released by us
    }).catch(reject);
  });
}

const held = new Set(); // vault ids whose device lock this page holds

/** `relay`: a Relay, or an async function of the device id giving one (a key minted for it).
 * Throws DeviceBusy while another tab of this browser has the vault open. */
export async function openDevice({ keys, relay, vaultId, relayName, label, problem }) {
  if (!(await holdDevice(vaultId))) {
    throw new DeviceBusy("this vault is open in another tab of this browser: use that tab, " +
      "or lock or close it and unlock here");
  }
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

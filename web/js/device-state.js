// The page's device across reloads (ours, not in PROTOCOL; docs/web-vault.md "Device across
// reloads"). Two records per vault in IndexedDB, each sealed with AES-256-GCM under the
// device-state key (keys.state: HKDF-SHA256 of the enc key's Argon2id output, info
// "engram-web-device-state-v1", non-extractable; kdf-worker.js):
//   device: {device_id, label, clock}  written before every push (PROTOCOL §8: the clock is
//           kept before a blob carrying it is sent, so a reload never reuses a clock value)
//   set:    {cursor, generation, full_pull (PROTOCOL §17), memories (§4 plaintexts), known,
//           pending, conflicts}  after each change
// A record's key is hex(HMAC-SHA256(keys.mac, "engram-web-device-state-v1\0" + kind + "\0" +
// vault_id))[0:32] (no vault id in the clear); its value {v: 1, nonce, ciphertext} (base64),
// with the record's key as the AES-GCM additional data, so a record moved to another key does
// not open. A record that does not open or does not hold what it should is ignored and
// reported, never trusted: a new device (device record) or a pull from cursor 0 (set record).

import { b64decode, b64encode, hex } from "./b64.js";

export const STATE_INFO = "engram-web-device-state-v1";
const DB_NAME = "engram-web";
const STORE = "sealed";
const VERSION = 1;
const enc = new TextEncoder();

export class StateError extends Error {}

function openDb() {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open(DB_NAME, 1);
    request.onupgradeneeded = () => request.result.createObjectStore(STORE);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

function idbDo(mode, act) {
  return openDb().then((db) => new Promise((resolve, reject) => {
    const tx = db.transaction(STORE, mode);
    const request = act(tx.objectStore(STORE));
    tx.oncomplete = () => { db.close(); resolve(request.result); };
    tx.onerror = () => { db.close(); reject(tx.error); };
  }));
}

export async function recordKey(keys, vaultId, kind) {
  const label = enc.encode(`${STATE_INFO}\0${kind}\0${vaultId}`);
  return hex(new Uint8Array(await crypto.subtle.sign("HMAC", keys.mac, label))).slice(0, 32);
}

export async function sealRecord(key, id, value) {
  const nonce = crypto.getRandomValues(new Uint8Array(12));
  const sealed = await crypto.subtle.encrypt({ name: "AES-GCM", iv: nonce,
    additionalData: enc.encode(id) }, key, enc.encode(JSON.stringify(value)));
  return { v: VERSION, nonce: b64encode(nonce), ciphertext: b64encode(new Uint8Array(sealed)) };
}

/** The record's value, or a StateError saying why it is not trusted. */
export async function openRecord(key, id, record) {
  if (record === null || typeof record !== "object" || record.v !== VERSION) {
    throw new StateError("not a sealed record of this version");
  }
  let plain;
  try {
    plain = await crypto.subtle.decrypt({ name: "AES-GCM", iv: b64decode(record.nonce),
      additionalData: enc.encode(id) }, key, b64decode(record.ciphertext));
  } catch {
    throw new StateError("it does not open under this vault's keys (tampered or not ours)");
  }
  try {
    return JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(plain));
  } catch {
    throw new StateError("its content is not JSON");
  }
}

const isSafe = (v) => Number.isSafeInteger(v) && v >= 0;
const isText = (v) => typeof v === "string" && v.length > 0 && v.length <= 256;

/** A device record's fields, checked (pure). */
export function checkDevice(d) {
  if (!d || !isText(d.device_id) || typeof d.label !== "string" || !isSafe(d.clock)) {
    throw new StateError("the device record lacks a device id, label or clock");
  }
  return { device_id: d.device_id, label: d.label, clock: d.clock };
}

/** A set record's fields, checked for shape (pure; the plaintexts are decoded by the vault). */
export function checkSet(s) {
  const lists = ["memories", "known", "pending", "conflicts"];
  if (!s || !isSafe(s.cursor) || !lists.every((n) => Array.isArray(s[n]))) {
    throw new StateError("the set record lacks a cursor or its lists");
  }
  // PROTOCOL §17: the generation the cursor belongs to (absent in records from before it)
  if (s.generation !== undefined && s.generation !== null && !isText(s.generation)) {
    throw new StateError("the set record's generation is not text");
  }
  if (s.full_pull !== undefined && typeof s.full_pull !== "boolean") {
    throw new StateError("the set record's full_pull is not a bool");
  }
  if (!s.known.every((k) => Array.isArray(k) && k.length === 4 && isSafe(k[1]))) {
    throw new StateError("the set record's known versions are malformed");
  }
  return s;
}

/** Where one vault's records live, sealed under `keys.state`. */
export class DeviceStore {
  constructor(keys, vaultId) {
    this.keys = keys;
    this.vaultId = vaultId;
    this.ids = null;
    this.writing = Promise.resolve();
  }

  async id(kind) {
    this.ids ??= { device: await recordKey(this.keys, this.vaultId, "device"),
      set: await recordKey(this.keys, this.vaultId, "set") };
    return this.ids[kind];
  }

  /** {device, set, problems}: a record that is absent is null; one not trusted is null and
   * a problem saying why (the caller reports it). */
  async load() {
    const problems = [];
    const out = { device: null, set: null, problems };
    for (const [kind, check] of [["device", checkDevice], ["set", checkSet]]) {
      const id = await this.id(kind);
      let record;
      try {
        record = await idbDo("readonly", (store) => store.get(id));
      } catch (e) {
        problems.push(`the stored ${kind} record could not be read: ${e?.message ?? e}`);
        continue;
      }
      if (record === undefined) continue;
      try {
        out[kind] = check(await openRecord(this.keys.state, id, record));
      } catch (e) {
        if (!(e instanceof StateError)) throw e;
        problems.push(`the stored ${kind} record was ignored: ${e.message}` +
          (kind === "device" ? "; this page registers as a new device" : "; pulling again"));
      }
    }
    if (out.device === null) out.set = null; // a set belongs to its device's clock
    return out;
  }

  /** Delete both records (a revoked device: the next unlock registers a new one). */
  forget() {
    const job = this.writing.then(async () => {
      for (const kind of ["device", "set"]) {
        const id = await this.id(kind);
        await idbDo("readwrite", (store) => store.delete(id));
      }
    });
    this.writing = job.catch(() => {});
    return job;
  }

  /** Seal and write one record; writes are queued so they land in order. */
  save(kind, value) {
    const job = this.writing.then(async () => {
      const id = await this.id(kind);
      const record = await sealRecord(this.keys.state, id, value);
      await idbDo("readwrite", (store) => store.put(record, id));
    });
    this.writing = job.catch(() => {});
    return job;
  }
}

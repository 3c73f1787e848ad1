// The page as a device (PROTOCOL §1, §8, §9): a device id, label and vector clock of its own
// (in memory in this slice: a reload is a new device), a cursor, the decrypted set, and the
// known version of each memory for LWW. A page failing its checks is refused whole and
// reported; a blob failing verify/decrypt/decode is skipped, counted and reported, never
// applied and never raising the clock.

import { open, seal } from "./blob.js";
import { checkPage, checkShape, PageRefused } from "./page-check.js";
import { decodePlaintext, encodeMemory, newMemory, tombstonePlaintext } from "./plaintext.js";
import { padPlaintext } from "./padding.js";
import { PAGE_LIMIT, RelayError } from "./relay.js";
import { instantMicros, nowRfc3339 } from "./timestamps.js";

const MAX_CLOCK_STEP = 2 ** 32; // docs/when-the-relay-lies.md "Clock bound"
const MAX_ID_CHARS = 256; // PROTOCOL §6 step 1
const CONTROL = /[\x00-\x1f\x7f]/;

export function idRefusal(value) {
  if (!value) return "memory_id is empty";
  if (value.length > MAX_ID_CHARS) return "memory_id is longer than 256 characters";
  if (CONTROL.test(value)) return "memory_id contains control characters";
  return null;
}

/** LWW (PROTOCOL §8), as remote_wins in client/_vault/store.py. */
export function remoteWins(remote, known) {
  if (!known || remote.vector_clock > known.vector_clock) return true;
  if (remote.vector_clock < known.vector_clock || remote.device_id === known.device_id) {
    return false;
  }
  const ra = instantMicros(remote.created_at) ?? -1n;
  const ka = instantMicros(known.created_at) ?? -1n;
  if (ra !== ka) return ra > ka;
  return remote.device_id > known.device_id;
}

export function newMemoryId() {
  return `mem_${crypto.randomUUID().slice(0, 16)}`; // as client/_vault/store.py new_memory_id
}

export class PushRefused extends Error {}

export class WebVault {
  constructor({ keys, relay, vaultId, relayName, label }) {
    this.keys = keys;
    this.relay = relay;
    this.vaultId = vaultId;
    this.relayName = relayName;
    this.label = label;
    this.deviceId = crypto.randomUUID();
    this.clock = 0;
    this.cursor = 0;
    this.memories = new Map();
    this.known = new Map();
    this.skipped = []; // {memory_id, device_id, vector_clock, reason}
    this.refused = []; // messages of refused pages
    this.revoked = false;
  }

  async register() {
    await this.relay.register(this.vaultId, this.deviceId, this.label);
  }

  /** Pull every page after the cursor; returns {applied, skipped}. Throws PageRefused. */
  async pull() {
    const report = { applied: 0, skipped: 0, pages: 0 };
    let resynced = false;
    for (;;) {
      let page;
      try {
        page = await this.relay.pull(this.vaultId, this.cursor, PAGE_LIMIT, this.deviceId);
      } catch (e) {
        // PROTOCOL §9, §12: a full re-pull from 0, reconciled by LWW; once per pull, so a
        // relay answering resync_required to cursor 0 too cannot keep the page pulling
        if (e instanceof RelayError && e.code === "resync_required" && !resynced) {
          resynced = true;
          this.cursor = 0;
          continue;
        }
        throw e;
      }
      try {
        checkShape(page);
        checkPage(page, { asked: this.cursor, limit: PAGE_LIMIT, relay: this.relayName });
      } catch (e) {
        if (e instanceof PageRefused) this.refused.push(e.message);
        throw e;
      }
      await this.applyPage(page.blobs, report);
      this.cursor = page.cursor;
      report.pages++;
      if (!page.has_more) return report;
    }
  }

  async applyPage(blobs, report) {
    let highest = 0;
    for (const blob of blobs) {
      if (await this.applyBlob(blob, report, highest)) highest = Math.max(highest, blob.vector_clock);
    }
    // PROTOCOL §1: after a pull the clock is at least the highest verified remote clock
    this.clock = Math.max(this.clock, highest);
  }

  skip(blob, reason, report) {
    report.skipped++;
    this.skipped.push({ memory_id: blob.memory_id.slice(0, 256), device_id:
      blob.device_id.slice(0, 256), vector_clock: blob.vector_clock, reason });
    return false;
  }

  async applyBlob(blob, report, ceiling) {
    if (blob.vault_id !== this.vaultId) return this.skip(blob, "blob names another vault", report);
    const refusal = idRefusal(blob.memory_id);
    if (refusal !== null) return this.skip(blob, refusal, report);
    let decoded;
    try {
      decoded = decodePlaintext(await open(this.keys, blob), blob.memory_id);
    } catch (e) {
      return this.skip(blob, `${e.constructor.name}: ${e.message}`, report);
    }
    if (blob.vector_clock > Math.max(this.clock, ceiling) + MAX_CLOCK_STEP) {
      return this.skip(blob, "vector clock jumps more than 2^32 above this device's clock", report);
    }
    const remote = { vector_clock: blob.vector_clock, device_id: blob.device_id,
      created_at: blob.created_at };
    if (!remoteWins(remote, this.known.get(blob.memory_id))) return true;
    if (blob.deleted || decoded.tombstone) this.memories.delete(blob.memory_id);
    else this.memories.set(blob.memory_id, decoded);
    this.known.set(blob.memory_id, remote);
    report.applied++;
    return true;
  }

  /** Seal one plaintext with ++clock and push it (PROTOCOL §8); throws PushRefused. */
  async pushOne(memoryId, plaintext, deleted) {
    if (this.revoked) throw new PushRefused("this browser device was revoked: nothing is pushed");
    const clock = ++this.clock;
    const blob = await seal(this.keys, padPlaintext(plaintext), { vault_id: this.vaultId,
      memory_id: memoryId, device_id: this.deviceId, vector_clock: clock, deleted,
      created_at: nowRfc3339() });
    const answer = await this.relay.push(this.vaultId, [blob]);
    if (Array.isArray(answer.revoked_devices) && answer.revoked_devices.includes(this.deviceId)) {
      this.revoked = true;
      throw new PushRefused("the relay says this browser device was revoked for the vault: " +
        "unlock again to sync as a new device, or ask an admin");
    }
    if (Array.isArray(answer.rejected) && answer.rejected.includes(memoryId)) {
      throw new PushRefused(`the relay holds a newer version of ${memoryId}: pull, then retry`);
    }
    this.known.set(memoryId, { vector_clock: clock, device_id: this.deviceId,
      created_at: blob.created_at });
    return blob;
  }

  async add(content, options = {}) {
    if (!content.trim()) throw new PushRefused("a memory's content must not be empty");
    const memory = newMemory(newMemoryId(), content, { ...options, now: nowRfc3339() });
    await this.pushOne(memory.id, encodeMemory(memory), false);
    this.memories.set(memory.id, memory);
    return memory;
  }

  async remove(memoryId) {
    await this.pushOne(memoryId, tombstonePlaintext(memoryId), true);
    this.memories.delete(memoryId);
  }

  /** Every memory, oldest first (as `engram-sync list`). */
  list() {
    return [...this.memories.values()].sort((a, b) => {
      const ka = instantMicros(a.created_at) ?? -1n;
      const kb = instantMicros(b.created_at) ?? -1n;
      if (ka !== kb) return ka < kb ? -1 : 1;
      return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    });
  }
}

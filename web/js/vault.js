// The page as a device (PROTOCOL §1, §8, §9): a device id, label and vector clock of its own
// (kept across reloads, sealed: device-state.js), a cursor, the decrypted set, and the known
// version of each memory for LWW. A page failing its checks is refused whole and reported; a
// blob failing verify/decrypt/decode is skipped, counted and reported, never applied and never
// raising the clock. A local version the relay did not take (rejected: it holds a newer one)
// stays pending; when a remote version beats it, it is kept as a conflict copy as the CLI keeps
// it in `sync_conflicts` (PROTOCOL §8: nothing is lost silently).

import { open, seal } from "./blob.js";
import { checkPage, checkShape, PageRefused } from "./page-check.js";
import { decodePlaintext, encodeMemory, newMemory, tombstonePlaintext } from "./plaintext.js";
import { padPlaintext } from "./padding.js";
import { PAGE_LIMIT, RelayError } from "./relay.js";
import { isGeneration, missingOnRelay, pullShowsRestore, pushShowsRestore } from "./restore.js";
import { instantMicros, nextModifiedAt, nowRfc3339 } from "./timestamps.js";

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
  constructor({ keys, relay, vaultId, relayName, label, deviceId = null, clock = 0,
    persist = null }) {
    this.keys = keys;
    this.relay = relay;
    this.vaultId = vaultId;
    this.relayName = relayName;
    this.label = label;
    this.deviceId = deviceId ?? crypto.randomUUID();
    this.clock = clock;
    this.cursor = 0;
    this.generation = null; // PROTOCOL §17: the relay generation the cursor belongs to
    this.fullPull = false; // §17: the next pull starts from 0 and pushes back what is missing
    this.memories = new Map();
    this.known = new Map();
    this.pending = new Map(); // memory_id -> {plaintext, modified_at, rejected}: not taken yet
    this.conflicts = []; // as sync_conflicts rows, oldest first
    this.skipped = []; // {memory_id, device_id, vector_clock, reason}
    this.refused = []; // messages of refused pages
    this.revoked = false;
    this.repairing = false; // pushing back what a restored relay lacks (PROTOCOL §17)
    this.onRestore = null; // called when a push answer shows a restore: the page pulls
    this.persist = persist; // {device(vault), set(vault)}: device-state.js, or null
  }

  /** The device record (device-state.js). */
  deviceRecord() {
    return { device_id: this.deviceId, label: this.label, clock: this.clock };
  }

  /** The set record: what a reload needs to resume from the cursor. */
  setRecord() {
    return {
      cursor: this.cursor,
      generation: this.generation,
      full_pull: this.fullPull,
      memories: [...this.memories.values()].map(encodeMemory),
      known: [...this.known].map(([id, k]) => [id, k.vector_clock, k.device_id, k.created_at]),
      pending: [...this.pending].map(([id, p]) => [id, p.plaintext, p.modified_at, p.rejected]),
      conflicts: this.conflicts,
    };
  }

  /** Take a checked set record back (device-state.js checkSet); a plaintext that does not
   * decode throws, and the caller pulls from cursor 0 instead. */
  restoreSet(set) {
    for (const text of set.memories) {
      const m = decodePlaintext(text);
      if (m.tombstone) throw new Error("a stored memory is a tombstone");
      this.memories.set(m.id, m);
    }
    for (const [id, vector_clock, device_id, created_at] of set.known) {
      this.known.set(id, { vector_clock, device_id, created_at });
    }
    for (const [id, plaintext, modified_at, rejected] of set.pending) {
      this.pending.set(id, { plaintext, modified_at, rejected: rejected === true });
    }
    this.conflicts = set.conflicts;
    this.cursor = set.cursor;
    this.generation = set.generation ?? null; // a record from before §17: a first contact
    this.fullPull = set.full_pull === true;
  }

  saveSet() {
    return this.persist ? this.persist.set(this) : Promise.resolve();
  }

  async register() {
    await this.relay.register(this.vaultId, this.deviceId, this.label);
  }

  /** Pull every page after the cursor; returns {applied, skipped, pages, conflicts, restored,
   * repushed}. Throws PageRefused. PROTOCOL §17: a page of another generation, or whose
   * vault sequence is below the cursor, starts a full re-pull from 0 (LWW as always), then
   * every version the relay did not send is pushed back; nothing is deleted. A full re-pull
   * (§9 resync_required or §17) happens at most once per pull, so a relay flipping its
   * generation on every page cannot keep the page pulling. */
  async pull({ wait = 0, signal } = {}) {
    const report = { applied: 0, skipped: 0, pages: 0, conflicts: 0, restored: this.fullPull,
      repushed: 0 };
    let seen = this.fullPull ? new Map() : null; // memory id -> highest verified clock sent
    if (seen) this.cursor = 0; // an interrupted repair starts again
    let last = null;
    for (;;) {
      let page;
      try {
        page = await this.relay.pull(this.vaultId, this.cursor, PAGE_LIMIT, this.deviceId,
          { wait: report.pages === 0 ? wait : 0, signal });
      } catch (e) {
        // PROTOCOL §9, §12: a full re-pull from 0, reconciled by LWW; once per pull, so a
        // relay answering resync_required to cursor 0 too cannot keep the page pulling
        if (e instanceof RelayError && e.code === "resync_required" && seen === null) {
          seen = new Map();
          this.cursor = 0;
          continue;
        }
        throw e;
      }
      try {
        checkShape(page);
        if (seen === null && pullShowsRestore(page, { known: this.generation,
          asked: this.cursor })) {
          seen = new Map(); // §17: checked against cursor 0 on the next round
          report.restored = this.fullPull = true;
          this.cursor = 0;
          continue;
        }
        checkPage(page, { asked: this.cursor, limit: PAGE_LIMIT, relay: this.relayName });
      } catch (e) {
        if (e instanceof PageRefused) this.refused.push(e.message);
        throw e;
      }
      await this.applyPage(page.blobs, report, seen);
      this.cursor = page.cursor;
      report.pages++;
      last = page;
      if (!page.has_more) break;
    }
    if (isGeneration(last.generation)) this.generation = last.generation; // §17
    if (seen !== null) report.repushed = await this.repushMissing(seen);
    return report;
  }

  /** PROTOCOL §17 after a full re-pull: push back (sealed anew with this device's id and
   * next clock, as the Python client re-pushes) every version the relay did not send;
   * tombstones too. A version the relay refuses (it holds a newer one) stays pending. */
  async repushMissing(seen) {
    const missing = missingOnRelay({ seen, known: this.known, memories: this.memories,
      pending: this.pending });
    let pushed = 0;
    this.repairing = true; // these answers are not checked for a restore: one per pull
    try {
      for (const { id, deleted } of missing) {
        const memory = this.memories.get(id);
        try {
          if (deleted) await this.pushOne(id, tombstonePlaintext(id), true, nowRfc3339());
          else await this.pushOne(id, encodeMemory(memory), false, memory.modified_at);
          pushed++;
        } catch (e) {
          if (!(e instanceof PushRefused) || this.revoked) throw e;
        }
      }
    } finally {
      this.repairing = false;
    }
    this.fullPull = false;
    this.saveSet();
    return pushed;
  }

  async applyPage(blobs, report, seen = null) {
    let highest = 0;
    for (const blob of blobs) {
      if (await this.applyBlob(blob, report, highest, seen)) {
        highest = Math.max(highest, blob.vector_clock);
      }
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

  async applyBlob(blob, report, ceiling, seen = null) {
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
    // §17: what the relay holds of this memory, verified (a full re-pull's reconcile)
    seen?.set(blob.memory_id, Math.max(seen.get(blob.memory_id) ?? 0, blob.vector_clock));
    if (!remoteWins(remote, this.known.get(blob.memory_id))) return true;
    const deleted = blob.deleted || decoded.tombstone === true;
    this.keepLosingLocal(blob, deleted ? tombstonePlaintext(blob.memory_id)
      : encodeMemory(decoded), deleted, report);
    if (deleted) this.memories.delete(blob.memory_id);
    else this.memories.set(blob.memory_id, decoded);
    this.known.set(blob.memory_id, remote);
    report.applied++;
    return true;
  }

  /** PROTOCOL §8 "Nothing is lost silently", as engine._apply_blob: a pending local version
   * beaten by a different remote one is kept as a conflict copy (our own push coming back
   * is not a conflict: it was taken after all). */
  keepLosingLocal(blob, incoming, deleted, report) {
    const local = this.pending.get(blob.memory_id);
    if (!local) return;
    this.pending.delete(blob.memory_id);
    if (blob.device_id === this.deviceId || local.plaintext === incoming) return;
    const last = this.conflicts.at(-1);
    this.conflicts.push({ id: (last?.id ?? 0) + 1, memory_id: blob.memory_id,
      local_plaintext: local.plaintext, local_modified_at: local.modified_at,
      remote_device_id: blob.device_id, remote_vector_clock: blob.vector_clock,
      remote_deleted: deleted, detected_at: nowRfc3339(), restored_at: null });
    report.conflicts++;
  }

  /** Open conflicts, newest first, as `engram-sync conflicts --json` lists them. */
  openConflicts() {
    return this.conflicts.filter((c) => c.restored_at === null).reverse().map((c) => {
      const kept = decodePlaintext(c.local_plaintext);
      return { id: c.id, memory_id: c.memory_id,
        local_content: kept.tombstone ? null : kept.content, local_deleted: !!kept.tombstone,
        local_modified_at: c.local_modified_at, remote_device_id: c.remote_device_id,
        remote_vector_clock: c.remote_vector_clock, remote_deleted: c.remote_deleted,
        detected_at: c.detected_at };
    });
  }

  /** `conflicts restore ID`: the kept version comes back as an ordinary new local edit. */
  async restoreConflict(conflictId) {
    const c = this.conflicts.find((x) => x.id === conflictId && x.restored_at === null);
    if (!c) throw new PushRefused(`no open conflict #${conflictId}`);
    const kept = decodePlaintext(c.local_plaintext, c.memory_id);
    c.restored_at = nowRfc3339();
    if (kept.tombstone) {
      await this.remove(c.memory_id);
    } else {
      const current = this.memories.get(c.memory_id);
      await this.write({ ...kept, modified_at: nextModifiedAt(kept.modified_at,
        current?.modified_at) });
    }
    return c.memory_id;
  }

  /** Seal one plaintext with ++clock and push it (PROTOCOL §8); throws PushRefused. Until
   * the relay takes it, the version stays pending (a rejected one is met by the next pull). */
  async pushOne(memoryId, plaintext, deleted, modifiedAt) {
    if (this.revoked) throw new PushRefused("this browser device was revoked: nothing is pushed");
    this.pending.set(memoryId, { plaintext, modified_at: modifiedAt, rejected: false });
    const clock = ++this.clock;
    if (this.persist) await this.persist.device(this); // §8: kept before it is sent
    const blob = await seal(this.keys, padPlaintext(plaintext), { vault_id: this.vaultId,
      memory_id: memoryId, device_id: this.deviceId, vector_clock: clock, deleted,
      created_at: nowRfc3339() });
    const answer = await this.relay.push(this.vaultId, [blob]);
    if (!this.repairing && !this.fullPull && pushShowsRestore(answer, {
      known: this.generation, cursor: this.cursor })) {
      this.fullPull = true; // PROTOCOL §17: the next pull re-pulls from 0 and repairs
      this.saveSet();
      this.onRestore?.();
    }
    if (Array.isArray(answer.revoked_devices) && answer.revoked_devices.includes(this.deviceId)) {
      this.revoked = true;
      await this.persist?.forget(); // a revoked id is never kept for the next unlock
      throw new PushRefused("the relay says this browser device was revoked for the vault: " +
        "unlock again to sync as a new device, or ask an admin");
    }
    if (Array.isArray(answer.rejected) && answer.rejected.includes(memoryId)) {
      this.pending.get(memoryId).rejected = true; // never pushed again over an unseen version
      this.saveSet();
      throw new PushRefused(`the relay holds a newer version of ${memoryId}: it is kept here ` +
        "and Sync pulls the newer one (a different one keeps yours as a conflict copy)");
    }
    this.pending.delete(memoryId);
    this.known.set(memoryId, { vector_clock: clock, device_id: this.deviceId,
      created_at: blob.created_at });
    this.saveSet();
    return blob;
  }

  /** Show a memory version at once and push it. */
  async write(memory) {
    this.memories.set(memory.id, memory);
    await this.pushOne(memory.id, encodeMemory(memory), false, memory.modified_at);
    return memory;
  }

  async add(content, options = {}) {
    if (!content.trim()) throw new PushRefused("a memory's content must not be empty");
    return this.write(newMemory(newMemoryId(), content, { ...options, now: nowRfc3339() }));
  }

  /** A new version with the content replaced (client/_vault/store.py edit_memory). */
  async edit(memoryId, content) {
    const current = this.memories.get(memoryId);
    if (!current) throw new PushRefused(`no memory ${memoryId}`);
    if (!content.trim()) throw new PushRefused("a memory's content must not be empty");
    return this.write({ ...current, content, modified_at: nextModifiedAt(current.modified_at) });
  }

  async remove(memoryId) {
    this.memories.delete(memoryId);
    await this.pushOne(memoryId, tombstonePlaintext(memoryId), true, nowRfc3339());
  }

  /** Push again what is still pending after a pull and was never rejected (a push that got no
   * answer); a rejected one waits for the pull that brings the newer version (PROTOCOL §8). */
  async pushPending() {
    for (const [id, p] of [...this.pending]) {
      if (p.rejected) continue;
      const decoded = decodePlaintext(p.plaintext, id);
      await this.pushOne(id, p.plaintext, decoded.tombstone === true, p.modified_at);
    }
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

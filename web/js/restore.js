// Relay restore detection and repair (PROTOCOL §17), as client/_sync/engine.py decides it
// (`_relay_restored`, `_push_shows_restore`) and client/_vault/store.py `repush_missing` picks
// what to push back. Pure functions: no I/O.
//
// The page stores the relay's generation with its cursor (device-state.js, set record). An
// answer of another generation (both strings), or a vault sequence below the page's cursor,
// means the relay lost commits the page had seen: the page pulls again from cursor 0 and
// pushes back every version the relay lacks. Missing is not deleted: only a verified
// tombstone deletes.

/** A generation the page keeps: text of 1..256 characters (the set record's bound); anything
 * else a relay sends is treated as absent, so it cannot make the record unreadable. */
export const isGeneration = (v) => typeof v === "string" && v.length > 0 && v.length <= 256;

/** Another generation than the one stored with the cursor; a first contact (none stored)
 * or an answer without one is no change. */
export function generationChanged(generation, known) {
  return isGeneration(generation) && isGeneration(known) && generation !== known;
}

/** A pull page (checked for shape) shows a restore: another generation, or a vault sequence
 * (`head`) below the cursor the page asked from. */
export function pullShowsRestore(page, { known, asked }) {
  if (generationChanged(page.generation, known)) return true;
  return Number.isSafeInteger(page.head) && page.head < asked;
}

/** A push answer shows a restore: another generation, or the vault's sequence after the
 * commit below the cursor the page had pulled to. */
export function pushShowsRestore(answer, { known, cursor }) {
  if (generationChanged(answer?.generation, known)) return true;
  return Number.isSafeInteger(answer?.cursor) && answer.cursor < cursor;
}

/** After a full re-pull that saw `seen` (memory id -> highest verified clock the relay
 * sent): the versions to push back, [{id, deleted}], as repush_missing. A memory this page
 * holds that the relay lacks, or holds only an older version of, goes back; a deletion goes
 * back only when the relay still holds an older live version (a memory the relay never had
 * needs no tombstone). Pending versions are left to the ordinary push of pending ones. */
export function missingOnRelay({ seen, known, memories, pending }) {
  const out = [];
  for (const [id, version] of known) {
    if (pending.has(id)) continue;
    const relay = seen.get(id);
    if (memories.has(id)) {
      if (relay === undefined || relay < version.vector_clock) out.push({ id, deleted: false });
    } else if (relay !== undefined && relay < version.vector_clock) {
      out.push({ id, deleted: true });
    }
  }
  return out;
}

// A cursor page no honest relay sends is refused whole (PROTOCOL §9; the Python client's
// check_page in client/_sync/engine.py, issue 13), and so is a page whose shape is not the
// wire type of PROTOCOL §5 (shared_format/wire.py PullResponse). Pure functions: no I/O.

const MAX_CURSOR = 2n ** 63n - 1n;
const BLOB_STRINGS = ["vault_id", "memory_id", "device_id", "ciphertext", "hmac", "created_at"];

export class PageRefused extends Error {}

const isCursor = (v) => Number.isSafeInteger(v) && v >= 0;

/** The shape of a pull answer (unknown fields ignored); a PageRefused naming the field. */
export function checkShape(page) {
  if (page === null || typeof page !== "object" || Array.isArray(page)) {
    throw new PageRefused("the pull answer is not a JSON object");
  }
  if (!Array.isArray(page.blobs)) throw new PageRefused("`blobs` is not a list");
  if (typeof page.has_more !== "boolean") throw new PageRefused("`has_more` is not a bool");
  for (const name of ["cursor", "head"]) {
    if (name in page && !isCursor(page[name])) {
      throw new PageRefused(`\`${name}\` is not a cursor (an integer 0..2^53-1)`);
    }
  }
  page.blobs.forEach((b, i) => {
    if (b === null || typeof b !== "object") throw new PageRefused(`blobs[${i}] is not an object`);
    for (const name of BLOB_STRINGS) {
      if (typeof b[name] !== "string") throw new PageRefused(`blobs[${i}].${name} is not text`);
    }
    if (!Number.isInteger(b.vector_clock) || b.vector_clock < 0) {
      throw new PageRefused(`blobs[${i}].vector_clock is not an unsigned integer`);
    }
    if (typeof b.deleted !== "boolean") throw new PageRefused(`blobs[${i}].deleted is not a bool`);
    if ("seq" in b && !isCursor(b.seq)) throw new PageRefused(`blobs[${i}].seq is not a cursor`);
  });
}

/** check_page of client/_sync/engine.py, rule for rule. */
export function checkPage(page, { asked, limit, relay }) {
  const refuse = (what) => new PageRefused(
    `the relay at ${relay} ${what} (asked for blobs after cursor ${asked}); the page was ` +
    "refused and nothing of it applied: the relay is faulty or lying, tell its operator");
  const cursor = page.cursor;
  if (!Number.isInteger(cursor)) throw refuse("answered a cursor pull without a cursor (PROTOCOL §9)");
  if (BigInt(cursor) > MAX_CURSOR) throw refuse(`sent cursor ${cursor}, above 2^63-1`);
  if (cursor < asked) throw refuse(`moved the cursor back to ${cursor}`);
  const head = Number.isInteger(page.head) ? page.head : null;
  if (head !== null && cursor > head) {
    throw refuse(`sent cursor ${cursor}, past the vault's sequence ${head}`);
  }
  if (page.blobs.length > limit) {
    throw refuse(`sent ${page.blobs.length} blobs for a page of at most ${limit}`);
  }
  // PROTOCOL §9, §12: a last page may end at exactly `head`, past its last blob.
  const toHead = !page.has_more && head !== null && cursor === head;
  if (page.blobs.length === 0) {
    if (cursor !== asked && !toHead) {
      throw refuse(`moved the cursor to ${cursor} without sending any blob`);
    }
    if (page.has_more) throw refuse("announced more blobs but sent none (no progress)");
    return;
  }
  let previous = asked;
  for (const blob of page.blobs) {
    if (Number.isInteger(blob.seq)) {
      if (blob.seq <= previous) throw refuse(`sent blob sequence ${blob.seq} after ${previous}`);
      previous = blob.seq;
    }
  }
  if (previous !== asked && cursor !== previous && !(toHead && cursor > previous)) {
    throw refuse(`sent cursor ${cursor} after a last blob of sequence ${previous}`);
  }
  if (cursor === asked) throw refuse("sent blobs without moving the cursor (no progress)");
}

// RFC 3339 as the Engram format writes it (PROTOCOL §3): UTC, microseconds, "+00:00" (never Z).
// Readers compare instants, never text.

const RFC3339 =
  /^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})$/;

export function nowRfc3339() {
  const iso = new Date().toISOString(); // YYYY-MM-DDTHH:MM:SS.mmmZ
  return `${iso.slice(0, 23)}000+00:00`;
}

/** Microseconds since the epoch as a BigInt, or null when `text` is not RFC 3339. */
export function instantMicros(text) {
  const m = typeof text === "string" ? RFC3339.exec(text) : null;
  if (m === null) return null;
  const offset = m[4] === "Z" || m[4] === "z" ? "+00:00" : m[4];
  const ms = Date.parse(`${m[1]}T${m[2]}${offset}`);
  if (Number.isNaN(ms)) return null;
  const frac = BigInt((m[3] || "").slice(0, 6).padEnd(6, "0"));
  return BigInt(ms) * 1000n + frac;
}

function fromMicros(micros) {
  const iso = new Date(Number(micros / 1000n)).toISOString();
  return `${iso.slice(0, 19)}.${String(micros % 1000000n).padStart(6, "0")}+00:00`;
}

/** Now, but strictly after every previous stamp (client/_vault/store.py next_modified_at). */
export function nextModifiedAt(...previous) {
  const stamp = nowRfc3339();
  let floor = null;
  for (const text of previous) {
    const at = instantMicros(text);
    if (at !== null && (floor === null || at > floor)) floor = at;
  }
  return floor !== null && instantMicros(stamp) <= floor ? fromMicros(floor + 1n) : stamp;
}

// The plaintext inside a blob (PROTOCOL §4), as shared_format/plaintext.py: a live memory is
// compact JSON with sorted keys (at every level) and exactly the listed keys; a tombstone is
// {"deleted":true,"id":…}. Decoding ignores unknown keys and normalises (unknown source →
// system, valence clamped to [-1, 1], strength to [0, 2], missing modified_at → created_at).

export const SOURCES = [
  "interaction", "sensor", "consolidation", "imagined", "chat", "slack", "discord",
  "telegram", "window", "mic", "agent", "research", "system", "user", "observation",
  "ai-session", "ai-tool",
];
const LAYERS = ["episodic", "semantic", "imagined"];
const PRIVACY = ["strict_local", "hybrid", "cloud_first", "enterprise"];
const LINK_TYPES = ["associative", "causal", "analogical", "temporal"];
// Fields msgspec writes as floats: "1.0", never "1".
const FLOAT_KEYS = new Set(["strength", "valence", "weight"]);

export class PlaintextError extends Error {}

function floatText(n) {
  if (!Number.isFinite(n)) throw new PlaintextError("a float must be finite");
  return Number.isInteger(n) && Math.abs(n) < 1e16 ? `${n}.0` : JSON.stringify(n);
}

/** Compact JSON with keys sorted at every level; `asFloat` marks msgspec float fields. */
export function canonicalJson(value, asFloat = false) {
  if (value === null) return "null";
  if (Array.isArray(value)) {
    return `[${value.map((v) => canonicalJson(v, asFloat)).join(",")}]`;
  }
  if (typeof value === "number") return asFloat ? floatText(value) : JSON.stringify(value);
  if (typeof value === "object") {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k],
      FLOAT_KEYS.has(k) || (k === "embedding" && value[k] !== null))}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

export function tombstonePlaintext(memoryId) {
  return canonicalJson({ deleted: true, id: memoryId });
}

/** A new memory as the CLI's `add` writes it (client/_vault/store.py add_memory). */
export function newMemory(id, content, { tags = [], project = null, layer = "episodic",
  now }) {
  return {
    id, content, layer, scope: "moment", content_type: "text", source: "user",
    privacy_level: "cloud_first", context: {}, created_at: now, modified_at: now,
    last_retrieved: null, occurred_at: null, project, tags, strength: 1.0, valence: 0.0,
    retrievals: 0, imagined: false, grounded: false, links: [], embedding: null,
    embedding_model: null,
  };
}

export function encodeMemory(memory) {
  return canonicalJson(memory);
}

const isStr = (v) => typeof v === "string";
const isNum = (v) => typeof v === "number" && Number.isFinite(v);

function field(obj, key, check, fallback, what) {
  if (!(key in obj)) {
    if (fallback === undefined) throw new PlaintextError(`plaintext lacks \`${key}\``);
    return fallback;
  }
  if (!check(obj[key])) throw new PlaintextError(`\`${key}\` is not ${what}`);
  return obj[key];
}

const strOrNull = (v) => v === null || isStr(v);
const clamp = (v, lo, hi) => Math.min(Math.max(v, lo), hi);

/** A decrypted plaintext as {tombstone: true, id} or a normalised memory object. */
export function decodePlaintext(text, expectedId) {
  let obj;
  try {
    obj = JSON.parse(text);
  } catch {
    throw new PlaintextError("plaintext is not JSON");
  }
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
    throw new PlaintextError("plaintext is not a JSON object");
  }
  let result;
  if (obj.deleted === true) {
    if (!isStr(obj.id)) throw new PlaintextError("tombstone plaintext lacks a string `id`");
    result = { tombstone: true, id: obj.id };
  } else {
    const createdAt = field(obj, "created_at", isStr, undefined, "text");
    const links = field(obj, "links", Array.isArray, [], "a list");
    const tags = field(obj, "tags", (v) => Array.isArray(v) && v.every(isStr), [], "text list");
    const source = field(obj, "source", isStr, "interaction", "text");
    result = {
      id: field(obj, "id", isStr, undefined, "text"),
      content: field(obj, "content", isStr, undefined, "text"),
      layer: field(obj, "layer", (v) => LAYERS.includes(v), undefined, "a layer"),
      scope: field(obj, "scope", isStr, "moment", "text"),
      content_type: field(obj, "content_type", isStr, "text", "text"),
      source: SOURCES.includes(source) ? source : "system",
      privacy_level: field(obj, "privacy_level", (v) => PRIVACY.includes(v), "cloud_first",
        "a privacy level"),
      context: "context" in obj ? obj.context : {},
      created_at: createdAt,
      modified_at: field(obj, "modified_at", strOrNull, null, "text") ?? createdAt,
      last_retrieved: field(obj, "last_retrieved", strOrNull, null, "text"),
      occurred_at: field(obj, "occurred_at", strOrNull, null, "text"),
      project: field(obj, "project", strOrNull, null, "text"),
      tags,
      strength: clamp(field(obj, "strength", isNum, 1.0, "a number"), 0, 2),
      valence: clamp(field(obj, "valence", isNum, 0.0, "a number"), -1, 1),
      retrievals: field(obj, "retrievals", Number.isInteger, 0, "an integer"),
      imagined: field(obj, "imagined", (v) => typeof v === "boolean", false, "a bool"),
      grounded: field(obj, "grounded", (v) => typeof v === "boolean", false, "a bool"),
      links: links.filter((l) => l && LINK_TYPES.includes(l.link_type) && isStr(l.target_id))
        .map((l) => ({ link_type: l.link_type, target_id: l.target_id,
          weight: isNum(l.weight) ? l.weight : 0.5 })),
      embedding: field(obj, "embedding", (v) => v === null || (Array.isArray(v) &&
        v.every(isNum)), null, "a list of numbers"),
      embedding_model: field(obj, "embedding_model", strOrNull, null, "text"),
    };
  }
  if (expectedId !== undefined && result.id !== expectedId) {
    throw new PlaintextError("plaintext id does not match the blob's memory_id");
  }
  return result;
}

// Search over the decrypted set with the CLI's semantics (docs/search.md, client/_vault/
// search.py): every word (AND), else any word (OR), else, when the query has no word a token
// can match, a case-insensitive substring search; each word is a phrase of FTS5 unicode61
// tokens. Order: best bm25 first (FTS5's formula: k1 = 1.2, b = 0.75, over the row's
// id and content), then the most recently modified, then by id. Filters: every tag, the
// project, the layer. Pure functions.

import { instantMicros } from "./timestamps.js";

export const DEFAULT_LIMIT = 20;
const K1 = 1.2;
const B = 0.75;

/** FTS5 unicode61 tokens: alphanumeric runs, case-folded, diacritics removed. */
export function tokens(text) {
  return text.normalize("NFD").replace(/\p{M}/gu, "").toLowerCase()
    .split(/[^\p{L}\p{N}\p{Co}]+/u).filter(Boolean);
}

function phraseCount(haystack, phrase) {
  let count = 0;
  outer: for (let i = 0; i + phrase.length <= haystack.length; i++) {
    for (let j = 0; j < phrase.length; j++) if (haystack[i + j] !== phrase[j]) continue outer;
    count++;
  }
  return count;
}

function modifiedKey(m) {
  return instantMicros(m.modified_at ?? m.created_at) ?? -1n;
}

/** The CLI's order after rank: most recently modified first, then by id. */
export function byRecency(a, b) {
  const ka = modifiedKey(a);
  const kb = modifiedKey(b);
  if (ka !== kb) return ka > kb ? -1 : 1;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

function passes(m, { tags = [], project = null, layer = null }) {
  return tags.every((t) => m.tags.includes(t)) && (project === null || m.project === project)
    && (layer === null || m.layer === layer);
}

/** An index over the memories' content, built once per change of the set. */
export class SearchIndex {
  constructor(memories) {
    this.rows = memories.map((m) => ({ memory: m, content: tokens(m.content),
      size: tokens(m.id).length + tokens(m.content).length }));
    const total = this.rows.reduce((n, r) => n + r.size, 0);
    this.avg = this.rows.length ? total / this.rows.length : 1;
  }

  _ranked(phrases, every, filters) {
    const hits = this.rows.filter((r) => passes(r.memory, filters)).map((r) => ({
      row: r, counts: phrases.map((p) => phraseCount(r.content, p)) }))
      .filter(({ counts }) => (every ? counts.every((c) => c > 0) : counts.some((c) => c > 0)));
    const n = this.rows.length;
    const idf = phrases.map((p) => {
      const hit = this.rows.filter((r) => phraseCount(r.content, p) > 0).length;
      const value = Math.log((n - hit + 0.5) / (hit + 0.5));
      return value <= 0 ? 1e-6 : value;
    });
    for (const h of hits) {
      h.score = h.counts.reduce((s, tf, i) => s + idf[i] * (tf * (K1 + 1)) /
        (tf + K1 * (1 - B + (B * h.row.size) / this.avg)), 0);
    }
    hits.sort((a, b) => (b.score - a.score) || byRecency(a.row.memory, b.row.memory));
    return hits.map((h) => h.row.memory);
  }

  /** {mode: "all" | "any" | "substring", results}: as `engram-sync search`. */
  search(query, { limit = DEFAULT_LIMIT, ...filters } = {}) {
    const needle = query.trim();
    if (!needle || limit <= 0) return { mode: "all", results: [] };
    const words = needle.split(/\s+/).filter((w) => /[\p{L}\p{N}]/u.test(w));
    const phrases = words.map(tokens).filter((p) => p.length > 0);
    if (phrases.length > 0) {
      let results = this._ranked(phrases, true, filters);
      if (results.length > 0 || phrases.length === 1) {
        return { mode: "all", results: results.slice(0, limit) };
      }
      results = this._ranked(phrases, false, filters);
      return { mode: "any", results: results.slice(0, limit) };
    }
    const low = needle.toLowerCase();
    const results = this.rows.map((r) => r.memory)
      .filter((m) => passes(m, filters) && m.content.toLowerCase().includes(low))
      .sort(byRecency);
    return { mode: "substring", results: results.slice(0, limit) };
  }
}

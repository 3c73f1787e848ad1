// Export of the decrypted vault as JSONL, in `engram-sync export`'s format
// (client/_vault/transfer.py export_lines): one PROTOCOL §4 plaintext per memory (compact JSON,
// keys sorted at every level), oldest first (created_at, then id), each line ending in "\n".
// The page never holds `agent_id` or an embedding's own stamp (engrams columns of a CLI vault
// that are not in the plaintext), so a memory with them exports without those two keys.

import { encodeMemory } from "./plaintext.js";

export function exportJsonl(memories) {
  return memories.map((m) => `${encodeMemory(m)}\n`).join("");
}

/** A download made in the page (Blob + object URL): nothing leaves the browser. */
export function download(text, name) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/x-ndjson" }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

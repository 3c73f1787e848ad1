// Length padding of plaintexts (PROTOCOL §16), as shared_format/padding.py: trailing ASCII
// spaces up to the PADMÉ length of the UTF-8 bytes. Readers need nothing (JSON ignores
// trailing whitespace).

export function padmeLength(length) {
  if (!Number.isSafeInteger(length) || length < 0) throw new RangeError("bad length");
  if (length < 2) return length; // 0 and 1: log2 undefined
  const e = Math.floor(Math.log2(length)); // exact for lengths below 2^53
  const s = Math.floor(Math.log2(e)) + 1;
  const step = 2 ** (e - s);
  return Math.ceil(length / step) * step;
}

export function padPlaintext(text) {
  const size = new TextEncoder().encode(text).length;
  return text + " ".repeat(padmeLength(size) - size);
}

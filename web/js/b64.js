// Strict standard base64 WITH '=' padding (PROTOCOL §3 blob fields), as shared_format/b64.py:
// only the alphabet, canonical padding, no whitespace, zero trailing bits. Messages never
// echo the input.

const STD = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

export class Base64Error extends Error {}

export function b64encode(bytes) {
  let text = "";
  const chunk = 0x8000;
  for (let i = 0; i < bytes.length; i += chunk) {
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + chunk));
  }
  return btoa(text);
}

export function b64decode(text) {
  if (typeof text !== "string" || !STD.test(text)) {
    throw new Base64Error("not canonical standard base64");
  }
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  if (b64encode(out) !== text) throw new Base64Error("non-zero trailing bits");
  return out;
}

export function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// The relay's routes the page uses (PROTOCOL §5, §9), same-origin through `engram-sync web`'s
// proxy (/v1/*). The API key goes in the Authorization header and nowhere else.

export const PAGE_LIMIT = 1000; // PROTOCOL §5: the relay caps a page at 1000

export class RelayError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class Relay {
  constructor(apiKey, base = "") {
    this.base = base;
    this.headers = { Authorization: `Bearer ${apiKey}` };
  }

  async request(method, path, body, extraHeaders = {}, signal = undefined) {
    const init = { method, headers: { ...this.headers, ...extraHeaders }, cache: "no-store",
      credentials: "omit", referrerPolicy: "no-referrer", signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(`${this.base}${path}`, init);
    const text = await response.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      const code = data && typeof data.code === "string" ? data.code : `http_${response.status}`;
      const said = data && typeof data.error === "string" ? data.error : text.slice(0, 200);
      throw new RelayError(response.status, code, `relay answered ${response.status}: ${said}`);
    }
    if (data === null) throw new RelayError(response.status, "not_json", "relay answer is not JSON");
    return data;
  }

  /** A cursor pull (§9); `deviceId` names the puller (X-Engram-Device, §12), so the relay
   * records how far this device pulled and compaction need not wait for it. `wait` > 0:
   * the long-poll of PROTOCOL §15 (the relay holds it until a commit or `wait` seconds). */
  pull(vaultId, cursor, limit = PAGE_LIMIT, deviceId = null, { wait = 0, signal } = {}) {
    const v = encodeURIComponent(vaultId);
    const extra = deviceId ? { "X-Engram-Device": deviceId } : {};
    const held = wait > 0 ? `&wait=${wait}` : "";
    return this.request("GET", `/v1/vaults/${v}/pull?cursor=${cursor}&limit=${limit}${held}`,
      undefined, extra, signal);
  }

  /** /v1/info (PROTOCOL §11): its `features` say which live feed the relay offers. */
  info(signal) {
    return this.request("GET", "/v1/info", undefined, {}, signal);
  }

  /** The event stream of PROTOCOL §15 through fetch, so the Authorization header is sent
   * (EventSource cannot send it); the Response, its body read by live.js. */
  events(vaultId, cursor, signal) {
    const v = encodeURIComponent(vaultId);
    return fetch(`${this.base}/v1/vaults/${v}/events?cursor=${cursor}`, { method: "GET",
      headers: { ...this.headers, Accept: "text/event-stream" }, cache: "no-store",
      credentials: "omit", referrerPolicy: "no-referrer", signal });
  }

  push(vaultId, blobs) {
    return this.request("POST", `/v1/vaults/${encodeURIComponent(vaultId)}/push`, { blobs });
  }

  register(vaultId, deviceId, label) {
    return this.request("POST", `/v1/vaults/${encodeURIComponent(vaultId)}/devices/register`,
      { device_id: deviceId, label });
  }
}

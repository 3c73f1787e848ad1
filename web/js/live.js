// The live change feed in the page (PROTOCOL §15; the Python client's client/_sync/live_feed.py):
// the relay's event stream read through fetch (so the Authorization header is sent: EventSource
// cannot), else the long-poll (`pull?cursor=N&wait=S`) when /v1/info does not list `events`
// or the stream keeps failing, else nothing (the Sync button). A `change` event is a hint
// only: its cursor must be an integer 0..2^53-1 that does not go back on the stream, anything
// else is refused and reported, never acted on; a valid hint makes the page pull with its own
// cursor, and that page is checked like any other (vault.js). A long-poll's answer is a hint
// too: it is dropped, and the page pulls. Reconnects back off (1 s floor, 60 s cap).

const MAX_LINE = 64 * 1024; // bytes of one SSE line; a longer one ends the stream
const LONG_POLL_S = 25; // PROTOCOL §15: 0 < S <= 60
const FAILURES_BEFORE_FALLBACK = 2;
const UNSUPPORTED = new Set([404, 405, 501]);

/** A change event's data as {cursor} or {why} (pure; as live_feed.parse_change). */
export function parseHint(data, last) {
  let change;
  try {
    change = JSON.parse(data);
  } catch {
    return { why: "not a change hint (not JSON)" };
  }
  const cursor = change?.cursor;
  if (!Number.isSafeInteger(cursor) || cursor < 0) {
    return { why: `cursor ${JSON.stringify(cursor)?.slice(0, 40)} is not an integer 0..2^53-1` };
  }
  if (last !== null && cursor < last) return { why: `cursor ${cursor} goes back from ${last}` };
  return { cursor };
}

/** SSE lines to events (the `event`/`data` fields; comments and `retry` ignored). */
export class SseParser {
  constructor() {
    this.buffer = "";
    this.event = "message";
    this.data = [];
  }

  /** Feed text; returns the events it completed, [{event, data}]. Throws on a huge line. */
  feed(text) {
    this.buffer += text;
    const out = [];
    let at;
    while ((at = this.buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = this.buffer.slice(0, at);
      this.buffer = this.buffer.slice(at + (this.buffer.startsWith("\r\n", at) ? 2 : 1));
      if (line === "") {
        if (this.data.length) out.push({ event: this.event, data: this.data.join("\n") });
        this.event = "message";
        this.data = [];
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (name === "event") this.event = value;
        else if (name === "data") this.data.push(value);
      }
    }
    if (this.buffer.length > MAX_LINE) throw new Error("an event stream line is too long");
    return out;
  }
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const timer = setTimeout(resolve, ms);
  signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
});

export class LiveFeed {
  /** `vault`: the WebVault; `wake()`: pull now; `problem(text)`; `mode(name)`. */
  constructor({ vault, wake, problem, mode }) {
    Object.assign(this, { vault, wake, problem, setMode: mode });
    this.controller = new AbortController();
    this.failures = 0;
    this.refused = 0;
  }

  start() {
    this.run().catch((e) => {
      if (!this.controller.signal.aborted) {
        this.problem(`the live feed stopped: ${e?.message ?? e}; Sync pulls by hand`);
        this.setMode("off");
      }
    });
    return this;
  }

  stop() {
    this.controller.abort();
  }

  async run() {
    const signal = this.controller.signal;
    let features = [];
    try {
      const info = await this.vault.relay.info(signal);
      features = Array.isArray(info.features) ? info.features : [];
    } catch {
      features = [];
    }
    let useEvents = features.includes("events");
    while (!signal.aborted) {
      let ok;
      if (useEvents) ok = await this.stream(signal);
      else if (features.includes("pull-wait")) ok = await this.longPoll(signal);
      else return this.setMode("off");
      if (ok === "final") return undefined;
      this.failures = ok ? 0 : this.failures + 1;
      if (ok === "unsupported" || (useEvents && this.failures >= FAILURES_BEFORE_FALLBACK)) {
        useEvents = false;
        this.failures = 0;
      }
      await sleep(ok ? 1000 : Math.min(60_000, 1000 * 2 ** Math.min(this.failures, 6)), signal);
    }
    return undefined;
  }

  /** One event stream; true when it worked, then ended; false, "unsupported" or "final". */
  async stream(signal) {
    let response;
    try {
      response = await this.vault.relay.events(this.vault.vaultId, this.vault.cursor, signal);
    } catch {
      return false;
    }
    if (!response.ok || !response.body) return UNSUPPORTED.has(response.status) ? "unsupported"
      : false;
    this.setMode("events");
    const parser = new SseParser();
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let last = null;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return true;
        for (const { event, data } of parser.feed(value)) {
          if (event === "revoked") {
            this.problem("the relay ended the live feed: this browser device was revoked");
            return "final";
          }
          if (event === "retired") this.wake();
          if (event !== "change") continue;
          const hint = parseHint(data, last);
          if (hint.why) {
            this.refused++;
            this.problem(`refused a live event from the relay: ${hint.why}`);
            continue;
          }
          last = hint.cursor;
          if (hint.cursor > this.vault.cursor) this.wake();
        }
      }
    } catch (e) {
      if (!signal.aborted) this.problem(`the live feed broke: ${e?.message ?? e}`);
      return false;
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  /** One long-poll; its page is only a wake-up (the page pulls, with every check). */
  async longPoll(signal) {
    this.setMode("long-poll");
    try {
      const page = await this.vault.relay.pull(this.vault.vaultId, this.vault.cursor, 1,
        this.vault.deviceId, { wait: LONG_POLL_S, signal });
      if (Array.isArray(page?.blobs) && page.blobs.length) this.wake();
      return true;
    } catch (e) {
      if (e?.code === "resync_required") this.wake();
      return UNSUPPORTED.has(e?.status) ? "unsupported" : false;
    }
  }
}

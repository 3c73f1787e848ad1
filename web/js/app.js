// The web vault's page: unlock, pull, list, search, view, add, edit, delete, conflicts, export,
// live updates (device.js, device-ui.js, live.js). Plain DOM (no inline
// script, no eval: the CSP of `engram-sync web` allows 'self' and 'wasm-unsafe-eval' only).
// Keys live in memory as non-extractable CryptoKeys; a reload, the Lock button or 15 minutes
// without input lock the page (everything is dropped with the page's state). Phases leave
// performance marks (engram:unlock, engram:keys, engram:pulled, engram:listed) and each search
// an `engram:search` measure, which `python -m bench.web_vault` reads; they hold no data.

import { deriveSyncKeys, vaultIdV2 } from "./kdf.js";
import { Relay } from "./relay.js";
import { SearchIndex } from "./search.js";
import { openDevice } from "./device.js";
import { renderConflicts, wireDeviceUi } from "./device-ui.js";
import { LiveFeed } from "./live.js";
import { wireAccountUnlock } from "./unlock-account.js";

const IDLE_LOCK_MS = 15 * 60 * 1000;
const $ = (id) => document.getElementById(id);
let vault = null;
let index = null;
let idleTimer = null;
let live = null;
let syncing = null;
let again = false;
let passkeys = null; // the passkey form (passkey.js): offered after a passphrase unlock too

function status(text, error = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", error);
}

function problem(text) {
  const li = document.createElement("li");
  li.textContent = text;
  $("problem-list").append(li);
  $("problems").open = true;
}

function lock() {
  live?.stop();
  vault = null;
  index = null;
  location.reload();
}

function touch() {
  clearTimeout(idleTimer);
  idleTimer = setTimeout(lock, IDLE_LOCK_MS);
}

function firstLine(text) {
  const line = text.split("\n", 1)[0];
  return line.length > 120 ? `${line.slice(0, 119)}…` : line;
}

function render(memories) {
  const list = $("memories");
  list.replaceChildren(...memories.map((m) => {
    const li = document.createElement("li");
    li.dataset.id = m.id;
    const id = document.createElement("span");
    id.className = "id";
    id.textContent = m.id;
    li.append(id, firstLine(m.content));
    li.addEventListener("click", () => show(m.id));
    return li;
  }));
}

function show(memoryId) {
  const m = vault.memories.get(memoryId);
  if (!m) return;
  $("view").hidden = false;
  $("view").dataset.id = m.id;
  $("view-id").textContent = m.id;
  $("view-content").textContent = m.content;
  const tags = m.tags.length ? ` · tags: ${m.tags.join(", ")}` : "";
  const project = m.project ? ` · project: ${m.project}` : "";
  $("view-meta").textContent = `${m.layer} · modified ${m.modified_at}${tags}${project}`;
}

/** The set changed (pull, add, delete): the search index is built again on next use. */
function changed() {
  index = null;
}

function refresh() {
  const query = $("search").value;
  if (query.trim()) {
    const started = performance.now();
    index ??= new SearchIndex(vault.list());
    const { mode, results } = index.search(query);
    $("search-mode").textContent = results.length ? (mode === "all" ? "" :
      `no memory has every word: ${mode === "any" ? "any word" : "substring"} matches`)
      : "no memory matches";
    render(results);
    performance.measure("engram:search", { start: started });
  } else {
    $("search-mode").textContent = "";
    render(vault.list());
  }
}

async function pullOnce() {
  const report = await vault.pull();
  performance.mark("engram:pulled");
  changed();
  for (const s of vault.skipped.splice(0)) {
    problem(`skipped ${s.memory_id} (device ${s.device_id}, clock ${s.vector_clock}): ${s.reason}`);
  }
  refresh();
  if (report.restored) {
    // PROTOCOL §17, said once per restore: the next pull stores the new generation
    problem(`the relay was restored: ${report.repushed} versions pushed back; nothing ` +
      "deleted (its generation changed or its sequence went back: everything pulled again)");
  }
  await vault.pushPending();
  renderConflicts(ui);
  vault.saveSet();
  // a live pull that brought nothing new leaves the status line as the last action set it
  if (report.applied === 0 && report.skipped === 0 && vault.synced) return;
  vault.synced = true;
  status(`Unlocked: ${vault.memories.size} memories (vault ${vault.vaultId.slice(0, 16)}…,` +
    ` device ${vault.deviceId.slice(0, 8)}…)` + (report.skipped ? `, ${report.skipped} skipped` : ""));
}

/** One pull at a time (the cursor is the vault's); a call during one makes it pull again. */
function sync() {
  if (syncing) {
    again = true;
    return syncing;
  }
  syncing = (async () => {
    do {
      again = false;
      await pullOnce();
    } while (again);
  })().finally(() => { syncing = null; });
  return syncing;
}

function startLive() {
  live = new LiveFeed({ vault, problem, wake: () => guarded(sync, false),
    mode: (name) => { $("live-mode").textContent = `live updates: ${name}`; } }).start();
}

/** Open the vault with `keys` (the passphrase's, or K's from an account or a passkey) as this
 * browser's device for it (device.js: the one kept across reloads, else a new one); `apiKey` is
 * a key, or a function of the device id that mints one (unlock-account.js). */
async function start(keys, vaultId, apiKey) {
  status("Pulling…");
  const relay = typeof apiKey === "function"
    ? async (deviceId) => new Relay(await apiKey(deviceId))
    : new Relay(apiKey);
  vault = await openDevice({ keys, relay, vaultId, relayName: location.origin,
    label: "web vault (browser)", problem });
  vault.onRestore = () => guarded(sync, false); // PROTOCOL §17: a push answer showed a restore
  for (const form of document.querySelectorAll(".locked-only")) form.hidden = true;
  $("vault").hidden = false;
  await sync();
  performance.mark("engram:listed");
  touch();
  startLive();
}

function failed(e, button) {
  vault = null;
  status(`Unlock failed: ${e.message}`, true);
  if (["PageRefused", "WrapRefused"].includes(e.constructor.name)) problem(e.message);
  button.disabled = false;
}

async function onUnlock(event) {
  event.preventDefault();
  $("unlock-button").disabled = true;
  const passphrase = $("passphrase").value;
  const apiKey = $("api-key").value.trim();
  performance.clearMarks();
  performance.mark("engram:unlock");
  try {
    status("Deriving keys…");
    const [keys, derivedId] = await Promise.all([deriveSyncKeys(passphrase),
      $("vault-id").value.trim() ? Promise.resolve(null) : vaultIdV2(passphrase)]);
    const vaultId = $("vault-id").value.trim() || derivedId;
    performance.mark("engram:keys");
    $("passphrase").value = "";
    $("api-key").value = "";
    await start(keys, vaultId, apiKey);
    // "Add a passkey" (passkey-vault.js): the key is sealed under the passkey, never stored bare
    passkeys.offer({ kind: "vault", relay: new Relay(apiKey), apiKey, keys, vaultId });
  } catch (e) {
    failed(e, $("unlock-button"));
  }
}

async function guarded(action, input = true) {
  if (input) touch();
  try {
    await action();
  } catch (e) {
    status(e.message, true);
    problem(e.message);
  }
}

const ui = { vault: () => vault, guarded, changed, refresh, show, status };

function onAdd(event) {
  event.preventDefault();
  guarded(async () => {
    const tags = $("add-tags").value.split(",").map((t) => t.trim()).filter(Boolean);
    const project = $("add-project").value.trim() || null;
    const memory = await vault.add($("add-content").value, { tags, project });
    $("add-content").value = "";
    changed();
    refresh();
    show(memory.id);
    status(`Added ${memory.id}: ${vault.memories.size} memories`);
  });
}

function onDelete() {
  guarded(async () => {
    const id = $("view").dataset.id;
    await vault.remove(id);
    $("view").hidden = true;
    changed();
    refresh();
    status(`Deleted ${id}: ${vault.memories.size} memories`);
  });
}

async function prefill() {
  // `engram-sync web` tells the page the linked vault id (public); never a key.
  try {
    const response = await fetch("engram-web.json", { cache: "no-store" });
    if (!response.ok) return;
    const config = await response.json();
    if (typeof config.vault_id === "string" && !$("vault-id").value) {
      $("vault-id").value = config.vault_id;
      $("account-vault-id").value ||= config.vault_id;
    }
  } catch {
    // served without `engram-sync web`: nothing to prefill
  }
}

$("unlock").addEventListener("submit", onUnlock);
$("add").addEventListener("submit", onAdd);
$("search-form").addEventListener("submit", (e) => { e.preventDefault(); touch(); refresh(); });
$("search").addEventListener("input", () => { touch(); refresh(); });
$("sync-button").addEventListener("click", () => guarded(sync));
$("lock-button").addEventListener("click", lock);
$("delete-button").addEventListener("click", onDelete);
wireDeviceUi(ui);
for (const kind of ["keydown", "pointerdown"]) document.addEventListener(kind, touch);
passkeys = wireAccountUnlock({ start, status, failed });
prefill();
document.body.dataset.ready = "1";

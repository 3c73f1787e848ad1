// The page's edit, conflicts and export controls (plain DOM, text only: never innerHTML).
// `ui` is app.js's: {vault(), guarded(action), changed(), refresh(), show(id), status(text)}.

import { download, exportJsonl } from "./export.js";

const $ = (id) => document.getElementById(id);

/** The kept conflict copies, as `engram-sync conflicts` prints them, with a Restore button. */
export function renderConflicts(ui) {
  const items = ui.vault().openConflicts();
  $("conflicts").hidden = items.length === 0;
  $("conflict-list").replaceChildren(...items.map((c) => {
    const li = document.createElement("li");
    li.dataset.id = String(c.id);
    const what = c.local_deleted ? "deletion" : (c.local_content ?? "").slice(0, 70);
    li.textContent = `#${c.id}  ${c.memory_id}  lost to ${c.remote_device_id}@` +
      `${c.remote_vector_clock}  ${c.detected_at.slice(0, 19)}  ${what}`;
    const restore = document.createElement("button");
    restore.type = "button";
    restore.textContent = "Restore";
    restore.addEventListener("click", () => ui.guarded(async () => {
      const id = await ui.vault().restoreConflict(c.id);
      ui.changed();
      ui.refresh();
      renderConflicts(ui);
      ui.status(`Restored conflict #${c.id} into ${id}`);
    }));
    li.append(" ", restore);
    return li;
  }));
}

export function wireDeviceUi(ui) {
  $("edit-button").addEventListener("click", () => {
    const m = ui.vault().memories.get($("view").dataset.id);
    if (!m) return;
    $("edit-content").value = m.content;
    $("edit").hidden = false;
  });
  $("edit").addEventListener("submit", (event) => {
    event.preventDefault();
    ui.guarded(async () => {
      const id = $("view").dataset.id;
      try {
        await ui.vault().edit(id, $("edit-content").value);
      } finally {
        ui.changed();
        ui.refresh();
        ui.show(id);
      }
      $("edit").hidden = true;
      ui.status(`Edited ${id}`);
    });
  });
  $("export-button").addEventListener("click", () => ui.guarded(async () => {
    const vault = ui.vault();
    download(exportJsonl(vault.list()), `engram-export-${vault.vaultId.slice(0, 16)}.jsonl`);
    ui.status(`Exported ${vault.memories.size} memories`);
  }));
}

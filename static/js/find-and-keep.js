/**
 * The sidebar's search (search-box.js) and a conversation's export and import
 * (conversation-export.js), wired to the page's elements; the thumbs (rating.js) announce through
 * the page's status line.
 */

import { ExportMenu, ImportButton } from "./conversation-export.js";
import { $ } from "./dom.js";
import { announceRatingsWith } from "./rating.js";
import { SearchBox } from "./search-box.js";

/** `add(conversation)` lists one; `open(id)` opens one. Returns the export menu (it follows
 * the open conversation: `exportMenu.show(id)`). */
export function findAndKeep({ announce, add, open }) {
  const search = new SearchBox({
    input: $("#conversation-search"),
    results: $("#search-results"),
    empty: $("#search-empty"),
    list: $("#conversation-nav"),
    area: $("#search-area"),
    announce,
    onOpen: open,
  });
  new ImportButton({
    button: $("#import-conversation"),
    file: $("#import-file"),
    error: $("#import-error"),
    announce,
    onImported(created) {
      search.clear();
      add(created);
      open(created.id);
    },
  });
  announceRatingsWith(announce);
  return { exportMenu: new ExportMenu({ menu: $("#export-menu"), markdown: $("#export-md"), json: $("#export-json") }) };
}

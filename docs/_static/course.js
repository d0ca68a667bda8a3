/* The course site's small fixes (docs/conf.py loads this on every page). */

/* Sidebar toggles. pydata-sphinx-theme 0.20 puts its own, hidden, menu buttons first in
   the page, and both themes' scripts bind only to the first `.primary-toggle` and
   `.secondary-toggle` they find (pydata-sphinx-theme#2451; sphinx-book-theme PRs #991 and
   #1000): the visible buttons of sphinx-book-theme did nothing, on a phone (the chapter
   list could not be opened) or on a desktop (it did not collapse). Each other toggle
   now forwards its click to the bound one, so the themes' own code runs: the drawer on
   narrow screens, collapsing the sidebar on wide ones. */
document.addEventListener("DOMContentLoaded", () => {
  for (const selector of [".primary-toggle", ".secondary-toggle"]) {
    const bound = document.querySelector(selector);
    if (!bound) continue;
    document.querySelectorAll(selector).forEach((button) => {
      if (button === bound) return;
      button.addEventListener("click", (event) => {
        event.preventDefault();
        event.stopPropagation();
        bound.click();
      });
    });
  }
});

/* Search from the disk. Opened from file://, the browser refuses the page fetches the
   search uses for its excerpts (console errors, empty excerpts): there it lists the
   matching pages without excerpts, and the search page says how to get them. */
if (window.location.protocol === "file:" && typeof DOCUMENTATION_OPTIONS !== "undefined") {
  DOCUMENTATION_OPTIONS.SHOW_SEARCH_SUMMARY = false;
  document.addEventListener("DOMContentLoaded", () => {
    const results = document.getElementById("search-results");
    if (!results) return;
    const note = document.createElement("p");
    note.className = "course-search-note";
    note.textContent = "Opened from the disk: search lists the matching pages without " +
      "excerpts. For excerpts, serve the site: python -m http.server -d build/site, " +
      "then open http://localhost:8000/.";
    results.parentNode.insertBefore(note, results);
  });
}

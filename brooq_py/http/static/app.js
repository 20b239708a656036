/* brooq dashboard: live refresh of the topics table, and its rows' action menus.
   The server renders the rows (escaped); this only swaps them in. No dependencies. */
(function () {
  "use strict";
  // One action menu (<details class="menu">) open at a time; Escape or a click elsewhere closes it.
  function closeMenus(except) {
    document.querySelectorAll("details.menu[open]").forEach(function (menu) {
      if (menu !== except) { menu.removeAttribute("open"); }
    });
  }
  document.addEventListener("click", function (event) {
    var menu = event.target.closest ? event.target.closest("details.menu") : null;
    closeMenus(menu);
  });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") { closeMenus(null); }
  });

  var table = document.querySelector("table[data-refresh]");
  if (!table || !window.fetch) { return; }
  var url = table.getAttribute("data-refresh");
  var every = parseInt(table.getAttribute("data-every"), 10) || 2000;
  var body = table.querySelector("tbody");
  var live = document.getElementById("live");
  var busy = false;

  function mark(ok) {
    if (!live) { return; }
    live.classList.toggle("stale", !ok);
    live.textContent = ok ? "live" : "reconnecting";
  }

  function typing() {
    var el = document.activeElement;
    return el !== null && el.tagName === "INPUT" && body.contains(el);
  }

  function tick() {
    // Never swap the rows under an open menu or a field being typed in.
    if (busy || document.hidden || typing() || body.querySelector("details.menu[open]")) { return; }
    busy = true;
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.redirected || response.status === 401) { window.location.reload(); return null; }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        // A menu opened or a field focused while the request was out keeps the rows too.
        if (html === null || typing() || body.querySelector("details.menu[open]")) { return; }
        body.innerHTML = html;
        mark(true);
      })
      .catch(function () { mark(false); })
      .then(function () { busy = false; });
  }

  window.setInterval(tick, every);
  document.addEventListener("visibilitychange", tick);
}());

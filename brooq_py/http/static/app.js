/* brooq dashboard: live refresh of the topics table, nothing else.
   The server renders the rows (escaped); this only swaps them in. No dependencies. */
(function () {
  "use strict";
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

  function tick() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.redirected || response.status === 401) { window.location.reload(); return null; }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        if (html === null) { return; }
        body.innerHTML = html;
        mark(true);
      })
      .catch(function () { mark(false); })
      .then(function () { busy = false; });
  }

  window.setInterval(tick, every);
  document.addEventListener("visibilitychange", tick);
}());

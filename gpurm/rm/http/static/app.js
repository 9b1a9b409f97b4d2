// gpurm web UI: live refresh, the jobs table's text filter, the kill button. No framework, no build step.
// Data are never inserted as HTML: a redraw takes the server-rendered (escaped) page, messages go in textContent.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var last = null;
  var polls = 0;

  function stamp(text) {
    var el = document.getElementById("updated");
    if (el) { el.textContent = text; }
  }

  function applyFilter() {
    var box = document.getElementById("find");
    var needle = box ? box.value.toLowerCase() : "";
    document.querySelectorAll("table.filterable tbody tr").forEach(function (row) {
      row.hidden = needle !== "" && row.textContent.toLowerCase().indexOf(needle) < 0;
    });
  }

  function redraw() {
    return fetch(location.href, {credentials: "same-origin"}).then(function (r) {
      if (!r.ok) { throw new Error("page: HTTP " + r.status); }
      return r.text();
    }).then(function (text) {
      var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("main");
      if (!fresh) { return; }
      var box = document.getElementById("find");
      var keep = box ? box.value : "";
      var focused = document.activeElement && document.activeElement.id === "find";
      main.replaceChildren.apply(main, Array.prototype.map.call(fresh.childNodes, function (n) {
        return document.importNode(n, true);
      }));
      var again = document.getElementById("find");
      if (again) { again.value = keep; if (focused) { again.focus(); } }
      bind();
      applyFilter();
    });
  }

  function poll() {
    var url = main && main.dataset.refresh;
    if (!url || document.hidden) { return; }     // a tab in the background costs the RM nothing
    polls += 1;
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}}).then(function (r) {
      return r.json().then(function (body) { return {ok: r.ok, body: body}; });
    }).then(function (res) {
      if (!res.ok) { stamp("refresh failed: " + (res.body.error ? res.body.error.message : "error")); return; }
      delete res.body.time_ms;
      var now = JSON.stringify(res.body);
      var changed = last !== null && now !== last;
      last = now;
      // Logs and telemetry grow without the API answer changing: redraw every 5th poll anyway.
      if (changed || polls % 5 === 0) { return redraw(); }
    }).then(function () {
      stamp("updated " + new Date().toLocaleTimeString());
    }).catch(function (err) { stamp("refresh failed: " + err.message); });
  }

  function bind() {
    var box = document.getElementById("find");
    if (box && !box.dataset.bound) { box.dataset.bound = "1"; box.addEventListener("input", applyFilter); }
    var kill = document.getElementById("kill");
    if (kill && !kill.dataset.bound) {
      kill.dataset.bound = "1";
      kill.addEventListener("click", function () {
        var job = kill.dataset.job;
        if (!window.confirm("Kill " + job + "?")) { return; }
        fetch("/api/v1/jobs/" + encodeURIComponent(job) + "/kill", {
          method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json"},
          body: JSON.stringify({reason: "killed from the web UI"})
        }).then(function (r) { return r.json().then(function (b) { return {ok: r.ok, body: b}; }); })
          .then(function (res) {
            if (!res.ok) { stamp("kill refused: " + res.body.error.message); return; }
            return redraw();
          });
      });
    }
  }

  bind();
  applyFilter();
  if (main && main.dataset.refresh) {
    poll();
    window.setInterval(poll, Number(main.dataset.every) || 3000);
  }
}());

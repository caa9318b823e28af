// lbs dashboard: live counters from /events (server-sent events). No framework, no build step.
// Pages work without this script; it only applies the snapshots the server pushes (one per interval,
// shared by every open page) to the elements marked data-live="<field>" of each data-service section,
// and swaps in a service's charts (rendered on the server as SVG) when its tallies change.
(function () {
  "use strict";
  var sections = document.querySelectorAll("[data-service]");
  var live = document.getElementById("live");
  if (!sections.length || !window.EventSource) {
    if (live) live.hidden = true;
    return;
  }
  var chartKeys = {};
  var lastSeen = 0;
  var refreshMs = parseInt(document.body.getAttribute("data-refresh-ms"), 10) || 2000;

  function set(el, value) {
    var text = String(value);
    if (el.textContent !== text) {
      el.textContent = text;
      el.classList.remove("moved");
      void el.offsetWidth; // restart the highlight
      el.classList.add("moved");
    }
  }

  function refreshCharts(section, data) {
    var box = section.querySelector("[data-charts]");
    if (!box || !data.series) return;
    var key = [data.series.start_ms, data.done_hour, data.failed_hour].join(":");
    var name = section.getAttribute("data-service");
    if (chartKeys[name] === key) return;  // the first snapshot always fetches: the page may be older
    chartKeys[name] = key;
    fetch(box.getAttribute("data-charts"), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var tmp = document.createElement("div");
        tmp.innerHTML = html;
        var fresh = tmp.querySelectorAll("svg");
        var old = box.querySelectorAll("svg");
        for (var i = 0; i < fresh.length && i < old.length; i++) old[i].replaceWith(fresh[i]);
      });
  }

  function apply(snapshot) {
    sections.forEach(function (section) {
      var data = snapshot[section.getAttribute("data-service")];
      if (!data) return;
      var err = section.querySelector("[data-live=error]");
      if (err) { err.hidden = !data.error; err.textContent = data.error || ""; }
      if (data.error) return;
      section.querySelectorAll("[data-live]").forEach(function (el) {
        var field = el.getAttribute("data-live");
        if (field !== "error" && data[field] !== undefined) set(el, data[field]);
      });
      refreshCharts(section, data);
    });
    document.body.setAttribute("data-snapshots", String((parseInt(document.body.getAttribute("data-snapshots"), 10) || 0) + 1));
  }

  var source = new EventSource("/events");
  source.addEventListener("snapshot", function (ev) {
    lastSeen = Date.now();
    if (live) { live.className = "live on"; live.title = "live: updated " + new Date().toLocaleTimeString(); }
    apply(JSON.parse(ev.data));
  });
  source.onerror = function () { if (live) live.className = "live stale"; };
  setInterval(function () {
    if (live && lastSeen && Date.now() - lastSeen > 3 * refreshMs) live.className = "live stale";
  }, refreshMs);
})();

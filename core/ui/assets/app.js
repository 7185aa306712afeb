// Berth dashboard: the only script of our own. It turns htmx's evaluation of
// code in attributes (hx-on, js: values) off: the extension below replaces
// the Function constructors htmx compiles such code with by ones that refuse.
// The Content-Security-Policy (no 'unsafe-eval') refuses it as well; this
// makes the refusal explicit and independent of the browser.
(function () {
  "use strict";
  function refuse() {
    throw new Error("berth: evaluating code from attributes is disabled");
  }
  htmx.registerExtension("berth-noeval", {
    init: function (api) {
      api.initSecurity(null, refuse, refuse);
    },
  });
})();

// Node charts: an element with data-node-metrics names the same-origin URL of
// the node's metrics ring as uPlot columns (time, CPU %, memory MiB); the two
// charts are drawn from it and redrawn every 10 s while the page is open.
// The script loads in the page's head: it starts once the document is parsed.
document.addEventListener("DOMContentLoaded", function () {
  "use strict";
  var box = document.querySelector("[data-node-metrics]");
  if (!box || typeof uPlot === "undefined") {
    return;
  }
  var url = box.getAttribute("data-node-metrics");
  var note = document.getElementById("chart-note");
  var plots = {};
  function draw(id, label, stroke, xs, ys) {
    var el = document.getElementById(id);
    var width = Math.max(240, el.clientWidth || 480);
    var data = [xs, ys];
    if (plots[id]) {
      plots[id].setData(data);
      return;
    }
    plots[id] = new uPlot({
      width: width, height: 180,
      series: [{}, { label: label, stroke: stroke, width: 2 }],
      axes: [{}, {}],
      legend: { show: true },
    }, data, el);
  }
  function load() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) {
        if (!r.ok) {
          return r.text().then(function (t) { throw new Error(t || ("HTTP " + r.status)); });
        }
        return r.json();
      })
      .then(function (m) {
        note.textContent = m.time.length ? (m.time.length + " samples") : "No sample yet.";
        draw("chart-cpu", "CPU %", "#1a4fb5", m.time, m.cpu_percent);
        draw("chart-memory", "Memory MiB", "#1e6b34", m.time, m.memory_mib);
      })
      .catch(function (e) {
        note.textContent = "The node's metrics are not available: " + e.message;
      });
  }
  load();
  setInterval(load, 10000);
});

// Live log: the workload page's output grows as its stream appends lines. It keeps
// following the end while the reader is at the end, and keeps at most about 5,000 lines
// (each line is at most three nodes: time, text or stderr span, newline).
document.addEventListener("DOMContentLoaded", function () {
  "use strict";
  var pre = document.getElementById("logs");
  if (!pre || typeof MutationObserver === "undefined") {
    return;
  }
  var maxNodes = 15000;
  var atEnd = true;
  pre.scrollTop = pre.scrollHeight;
  pre.addEventListener("scroll", function () {
    atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
  });
  new MutationObserver(function () {
    while (pre.childNodes.length > maxNodes) {
      pre.removeChild(pre.firstChild);
    }
    if (atEnd) {
      pre.scrollTop = pre.scrollHeight;
    }
  }).observe(pre, { childList: true });
});

// The dashboard's page, script and style (state.hpp), served by troupe itself: no CDN, nothing
// fetched from elsewhere. The script puts every name into the document with textContent or
// setAttribute on elements it made, never as markup, and the page's Content-Security-Policy
// (dashboard.cpp) lets no inline script run; the charts are SVG drawn in the look of
// troupe/core/report.hpp's (same palette, axes and ticks).

#include "dashboard/state.hpp"

namespace troupe::detail {

const std::string& dashboard_page() {
  static const std::string page = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>troupe dashboard</title><link rel="stylesheet" href="/dashboard.css"></head>
<body data-updates="0">
<header><h1 id="title">troupe</h1><span id="live" class="live">connecting</span> <span id="updated"></span></header>
<main>
<section id="cluster" hidden>
<h2>Nodes</h2><div id="nodes"></div>
<h2>Actors by type</h2><div id="types"></div>
<h2>Busiest actors</h2><div id="actors"></div>
<h2>Actor failures and restarts</h2><div id="failures"></div>
</section>
<section id="run" hidden>
<h2 id="run-kind">Run</h2><div id="figures"></div><div id="charts" class="charts"></div><div id="tables"></div>
<div id="timeline" hidden><h2>Pipeline: the last measured step, per rank</h2><img id="timeline-img" alt="the pipeline's last measured step"></div>
<div id="schedule" hidden><h2>Pipeline schedule</h2><img id="schedule-img" alt="the pipeline's schedule"></div>
<h2>Options</h2><div id="options"></div>
</section>
<section><h2>Recent events</h2><ul id="events"></ul></section>
</main>
<footer><a href="/metrics">/metrics</a> · <a href="/api/state">/api/state</a></footer>
<script src="/dashboard.js"></script>
</body></html>
)";
  return page;
}

const std::string& dashboard_style() {
  static const std::string style = R"(body{font-family:sans-serif;max-width:72em;margin:1em auto;color:#222;padding:0 1em}
header{display:flex;align-items:baseline;gap:1em}h1{margin:.2em 0}h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;margin:.3em 0;font-size:.92em}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.live{font-size:.85em;padding:.1em .5em;border-radius:.8em;background:#eee}.live.on{background:#d4f4d4}.live.off{background:#f8d0d0}
.lost{color:#d62728;font-weight:bold}.alive{color:#2ca02c}.charts{display:flex;flex-wrap:wrap;gap:1em}
ul#events{font-size:.9em;padding-left:1.2em}#updated{color:#777;font-size:.85em}footer{margin:2em 0;color:#777;font-size:.85em}
form{margin:1em 0}input{padding:.3em}#schedule img,#timeline img{max-width:100%}td{max-width:48em;overflow-wrap:anywhere}
)";
  return style;
}

const std::string& dashboard_script() {
  static const std::string script = R"JS("use strict";
// troupe dashboard: renders /api/state and what /events pushes. Names go into the page as text
// only (textContent, setAttribute on elements made here), never as markup.
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  const $ = (id) => document.getElementById(id);
  let updates = 0, firstVersion = -1;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function fmt(v) {
    if (typeof v !== "number" || !isFinite(v)) return "n/a";
    const a = Math.abs(v);
    if (a >= 10000 || (Number.isInteger(v) && a < 1e15)) return String(Math.round(v));
    return v.toPrecision(4);
  }
  // A table of `rows` (arrays of cells; a cell is a value, or {text, cls}) under `header`.
  function table(container, header, rows, numeric) {
    const t = el("table"), head = el("tr");
    header.forEach((h) => head.appendChild(el("th", h)));
    t.appendChild(head);
    rows.forEach((r) => {
      const tr = el("tr");
      r.forEach((c, i) => {
        const cell = (c !== null && typeof c === "object") ? c : { text: c };
        const td = el("td", typeof cell.text === "number" ? fmt(cell.text) : cell.text, cell.cls);
        if (numeric && numeric[i]) td.classList.add("n");
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
    container.replaceChildren(t);
  }
  function ticks(lo, hi, n) {
    const span = hi - lo, raw = span / Math.max(1, n), mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => span / s <= n) || 10 * mag;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }
  // One line chart as the reports draw it: axes, round-number ticks, a polyline per series.
  function chart(c) {
    const W = 460, H = 260, L = 56, R = 12, T = 28, B = 40;
    const pts = [].concat(...c.series.map((s) => s.points));
    const root = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, "font-family": "sans-serif", "font-size": 11, role: "img" });
    root.appendChild(svg("title", {}, c.title));
    root.appendChild(svg("text", { x: W / 2, y: 16, "text-anchor": "middle", "font-size": 13 }, c.title));
    if (pts.length === 0) {
      root.appendChild(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no point yet"));
      return root;
    }
    let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
    let y0 = Math.min(...pts.map((p) => p[1])), y1 = Math.max(...pts.map((p) => p[1]));
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R), sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    root.appendChild(svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#999" }));
    ticks(x0, x1, 6).forEach((v) => {
      root.appendChild(svg("line", { x1: sx(v), x2: sx(v), y1: H - B, y2: H - B + 4, stroke: "#999" }));
      root.appendChild(svg("text", { x: sx(v), y: H - B + 15, "text-anchor": "middle" }, fmt(v)));
    });
    ticks(y0, y1, 5).forEach((v) => {
      root.appendChild(svg("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), stroke: "#eee" }));
      root.appendChild(svg("text", { x: L - 4, y: sy(v) + 4, "text-anchor": "end" }, fmt(v)));
    });
    root.appendChild(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, c.x_label));
    root.appendChild(svg("text", { x: 12, y: (T + H - B) / 2, "text-anchor": "middle", transform: "rotate(-90 12 " + (T + H - B) / 2 + ")" }, c.y_label));
    c.series.forEach((s, i) => {
      const colour = palette[i % palette.length];
      root.appendChild(svg("polyline", { fill: "none", stroke: colour, "stroke-width": 1.5,
        points: s.points.map((p) => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" ") }));
      if (s.points.length < 60) s.points.forEach((p) => root.appendChild(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: colour })));
      root.appendChild(svg("rect", { x: L + 8, y: T + 6 + 14 * i, width: 10, height: 3, fill: colour }));
      root.appendChild(svg("text", { x: L + 22, y: T + 10 + 14 * i }, s.name));
    });
    return root;
  }

  function render(s) {
    updates += 1;
    if (firstVersion < 0) firstVersion = s.version;
    document.body.setAttribute("data-updates", String(updates));
    document.body.setAttribute("data-first-version", String(firstVersion));
    document.body.setAttribute("data-version", String(s.version));
    $("title").textContent = s.title;
    document.title = s.title + " dashboard";
    $("updated").textContent = "updated " + new Date().toLocaleTimeString() + " (state " + s.version + ")";
    $("cluster").hidden = !s.cluster;
    if (s.cluster) {
      table($("nodes"), ["node", "address", "liveness", "labels", "actors", "mailbox depth", "msg/s", "dead letters", "problem"],
        s.nodes.map((n) => [n.node, n.address, n.alive ? { text: "alive", cls: "alive" } : { text: "LOST", cls: "lost" },
          n.labels.join(", "), n.actors, n.mailbox_depth, n.messages_per_s, n.dead_letters, n.problem]),
        [true, false, false, false, true, true, true, true, false]);
      table($("types"), ["type", "actors", "mailbox depth", "deepest mailbox", "messages", "msg/s", "restarts", "failed"],
        s.actor_types.map((t) => [t.type, t.count, t.mailbox_depth, t.max_mailbox_depth, t.messages, t.messages_per_s,
          t.restarts, t.failed]),
        [false, true, true, true, true, true, true, true]);
      table($("actors"), ["node", "id", "type", "name", "mailbox depth", "messages", "msg/s", "restarts"],
        s.actors.map((a) => [a.node, a.id, a.type, a.name, a.mailbox_depth, a.messages, a.messages_per_s, a.restarts]),
        [true, true, false, false, true, true, true, true]);
      if (s.failures.length)
        table($("failures"), ["when", "node", "actor", "type", "outcome", "failure"],
          s.failures.map((f) => [f.when, f.node, f.actor, f.type,
            f.restarted ? "restart " + f.restarts : { text: "stopped", cls: "lost" }, f.what]),
          [false, true, true, false, false, false]);
      else $("failures").replaceChildren(el("p", "none"));
    }
    const run = s.run;
    const hasRun = run.kind !== "" || run.charts.length > 0;
    $("run").hidden = !hasRun;
    if (hasRun) {
      $("run-kind").textContent = run.kind || "Run";
      table($("figures"), ["figure", "value", "meaning"], run.figures.map((f) => [f.name, f.value, f.help]), [false, true, false]);
      $("charts").replaceChildren(...run.charts.map(chart));
      $("tables").replaceChildren(...run.tables.map((t) => {
        const box = el("div", null, "table");
        box.appendChild(el("h2", t.title));
        const body = el("div");
        table(body, t.columns, t.rows, t.columns.map((c) => c !== "ids"));
        box.appendChild(body);
        return box;
      }));
      table($("options"), ["option", "value"], run.options);
      $("schedule").hidden = !run.schedule;
      if (run.schedule && !$("schedule-img").getAttribute("src")) $("schedule-img").setAttribute("src", "/schedule.svg");
      // The measured step: a new drawing each time the run publishes one (its count in the URL).
      $("timeline").hidden = !run.timeline;
      const tl = "/timeline.svg?n=" + run.timeline;
      if (run.timeline && $("timeline-img").getAttribute("src") !== tl) $("timeline-img").setAttribute("src", tl);
    }
    $("events").replaceChildren(...(s.events.length ? s.events.map((e) => el("li", e.when + "  " + e.text)) : [el("li", "none")]));
  }

  function poll() {
    fetch("/api/state", { credentials: "same-origin", cache: "no-store" })
      .then((r) => { if (r.status === 401) location.href = "/login"; return r.json(); })
      .then(render).catch(() => { $("live").textContent = "offline"; $("live").className = "live off"; });
  }
  // Live: server-sent events where the browser has them (every current one), polling otherwise.
  if (window.EventSource) {
    const es = new EventSource("/events");
    es.onopen = () => { $("live").textContent = "live"; $("live").className = "live on"; };
    es.onmessage = (e) => render(JSON.parse(e.data));
    es.onerror = () => { $("live").textContent = "reconnecting"; $("live").className = "live off"; };
  } else {
    poll();
    setInterval(poll, 2000);
  }
})();
)JS";
  return script;
}

}  // namespace troupe::detail

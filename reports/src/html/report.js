"use strict";
(function () {
  var D = JSON.parse(document.getElementById("perfkit-data").textContent);
  var SVGNS = "http://www.w3.org/2000/svg";
  var tip = document.getElementById("tip");

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) e.setAttribute(k, String(attrs[k]));
    return e;
  }
  function fmtNs(ns) {
    if (ns >= 1e9) return (ns / 1e9).toFixed(3) + " s";
    if (ns >= 1e6) return (ns / 1e6).toFixed(3) + " ms";
    if (ns >= 1e3) return (ns / 1e3).toFixed(2) + " us";
    return Math.round(ns) + " ns";
  }
  function fmtBytes(b) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i ? b.toFixed(1) : String(Math.round(b))) + " " + u[i];
  }
  function fmtRate(gbps) {
    if (gbps >= 1) return gbps.toFixed(2) + " GB/s";
    if (gbps >= 1e-3) return (gbps * 1e3).toFixed(2) + " MB/s";
    return (gbps * 1e6).toFixed(2) + " KB/s";
  }
  function fmt(kind, v) {
    if (v === null || v === undefined) return "";
    if (kind === "ns") return fmtNs(v);
    if (kind === "bytes") return fmtBytes(v);
    if (kind === "rate") return fmtRate(v);
    if (kind === "pct") return (v * 100).toFixed(1) + " %";
    return String(v);
  }
  function showTip(ev, text) {
    tip.textContent = text;
    tip.style.display = "block";
    tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 340) + "px";
    tip.style.top = (ev.clientY + 12) + "px";
  }
  function hideTip() { tip.style.display = "none"; }

  // Header.
  document.getElementById("source").textContent = D.source;
  var meta = [];
  D.processes.forEach(function (p) {
    meta.push(p.label + " on " + p.host + ": " + p.command);
  });
  document.getElementById("meta").textContent = [D.generator, D.created, D.complete ? "" : "INCOMPLETE RUN (" + (D.incomplete_reasons.length ? D.incomplete_reasons.join("; ") : "a trace was cut short") + ")", (D.notes || []).length ? "NOTE: " + D.notes.join("; ") : "", meta.join(" | ")]
    .filter(function (x) { return x; }).join(" \u00b7 ");

  // Cards.
  var cards = document.getElementById("cards");
  D.cards.forEach(function (c) {
    var d = el("div", "card" + (c.warn ? " warn" : ""));
    d.appendChild(el("div", "v", c.value));
    d.appendChild(el("div", "l", c.label));
    cards.appendChild(d);
  });

  // Stacked per-step chart.
  (function () {
    var host = document.getElementById("step-chart");
    var pts = D.steps.points;
    if (!pts.length) { host.appendChild(el("p", "empty", "No steps recorded (no spans named \u201c" + D.steps.span + "\u201d).")); return; }
    var W = Math.max(host.clientWidth || 900, 600), H = 220, L = 64, B = 24, T = 8;
    var max = 0;
    pts.forEach(function (p) { max = Math.max(max, p[1]); });
    if (max <= 0) max = 1;
    var svg = sv("svg", { width: W, height: H, "class": "stepsvg", role: "img" });
    var bw = (W - L - 8) / pts.length;
    var gpu = D.steps.gpu !== false;
    var colors = gpu ? ["#2f7ed8", "#f28f2c", "#d6453d", "#c9ced6"] : ["#7f9cb8"];
    var names = gpu ? ["kernels", "copies", "sync wait", "idle"] : ["host"];
    if (!gpu) {
      // No GPU work in this run: one bar per step, its whole wall time.
      var legend = document.getElementById("step-legend");
      legend.textContent = "";
      legend.appendChild(el("span", "", "whole step (no GPU work was recorded, so there is no GPU breakdown)"));
    }
    for (var g = 0; g <= 4; g++) {
      var y = T + (H - T - B) * (1 - g / 4);
      svg.appendChild(sv("line", { x1: L, x2: W - 4, y1: y, y2: y, stroke: "#e3e6ea" }));
      var t = sv("text", { x: L - 6, y: y + 4, "text-anchor": "end" });
      t.textContent = fmtNs(max * g / 4);
      svg.appendChild(t);
    }
    pts.forEach(function (p, i) {
      var x = L + i * bw, y = H - B;
      var parts = gpu ? [p[2], p[3], p[4], p[5]] : [p[1]];
      var g = sv("g", { "class": "step-bar" });
      parts.forEach(function (v, k) {
        var h = (H - T - B) * v / max;
        if (h <= 0) return;
        y -= h;
        g.appendChild(sv("rect", { x: x, y: y, width: Math.max(bw - (bw > 3 ? 1 : 0), 0.5), height: h, fill: colors[k] }));
      });
      var label = (D.steps.bucket > 1 ? "steps from " : "step ") + p[0] + ": " + fmtNs(p[1]) + "\n" +
        names.map(function (n, k) { return n + " " + fmtNs(parts[k]); }).join(", ");
      g.addEventListener("mousemove", function (ev) { showTip(ev, label); });
      g.addEventListener("mouseleave", hideTip);
      svg.appendChild(g);
    });
    var xl = sv("text", { x: L, y: H - 6 });
    xl.textContent = "step " + pts[0][0] + " \u2192 " + pts[pts.length - 1][0] + (D.steps.bucket > 1 ? " (" + D.steps.bucket + " steps per bar, averaged)" : "");
    svg.appendChild(xl);
    host.appendChild(svg);
  })();

  // Memory chart.
  (function () {
    var host = document.getElementById("memory-chart");
    var pts = D.memory.points;
    if (!pts.length) { host.appendChild(el("p", "empty", "No device allocations recorded.")); return; }
    var W = Math.max(host.clientWidth || 900, 600), H = 160, L = 64, B = 22, T = 8;
    var t0 = pts[0][0], t1 = pts[pts.length - 1][0], max = 0;
    pts.forEach(function (p) { max = Math.max(max, p[1]); });
    if (t1 <= t0) t1 = t0 + 1;
    if (max <= 0) max = 1;
    var svg = sv("svg", { width: W, height: H, "class": "memsvg" });
    function X(t) { return L + (W - L - 8) * (t - t0) / (t1 - t0); }
    function Y(b) { return T + (H - T - B) * (1 - b / max); }
    var d = "M" + X(pts[0][0]) + " " + Y(0);
    pts.forEach(function (p) { d += " L" + X(p[0]) + " " + Y(p[1]); });
    d += " L" + X(t1) + " " + Y(pts[pts.length - 1][1]) + " L" + X(t1) + " " + Y(0) + " Z";
    svg.appendChild(sv("path", { d: d, fill: "#2f7ed8", "fill-opacity": 0.25, stroke: "#2f7ed8" }));
    [0, 0.5, 1].forEach(function (f) {
      var t = sv("text", { x: L - 6, y: Y(max * f) + 4, "text-anchor": "end" });
      t.textContent = fmtBytes(max * f);
      svg.appendChild(t);
    });
    var xl = sv("text", { x: L, y: H - 5 });
    xl.textContent = "peak " + fmtBytes(D.memory.peak) + " \u00b7 " + fmtNs(t1 - t0) + " shown";
    svg.appendChild(xl);
    host.appendChild(svg);
  })();

  // Timeline of chosen steps (canvas, zoom with the wheel, pan by dragging).
  (function () {
    var host = document.getElementById("timeline");
    var tl = D.timeline;
    if (!tl.windows.length) { host.appendChild(el("p", "empty", "No steps to show.")); return; }
    var bar = el("div", "tabs");
    var info = el("div", "info");
    var canvas = document.createElement("canvas");
    canvas.id = "timeline-canvas";
    host.appendChild(bar);
    host.appendChild(canvas);
    host.appendChild(info);
    var cur = 0, view = null, rows = [], items = [];
    var colors = { span: "#7aa6c2", kernel: "#2f7ed8", H2D: "#f28f2c", D2H: "#e4572e", D2D: "#f6b26b", memset: "#f6b26b", sync: "#d6453d", launch: "#9aa5b1" };
    function select(w) {
      cur = w;
      var win = tl.windows[w];
      view = [win.start, Math.max(win.end, win.start + 1)];
      items = [];
      rows = [];
      tl.tracks.forEach(function (tr) {
        var maxd = -1, its = tr.items.filter(function (it) { return it[0] === w; });
        if (!its.length) return;
        its.forEach(function (it) { maxd = Math.max(maxd, it[3]); });
        rows.push({ name: tr.name, base: items.length, depth: maxd + 1, its: its });
      });
      Array.prototype.forEach.call(bar.children, function (b, i) { b.className = i === w ? "active" : ""; });
      info.textContent = win.label + " (step " + win.step + ", " + fmtNs(win.end - win.start) + ")" +
        (win.truncated ? " \u2014 " + win.truncated + " items not shown" : "") + " \u00b7 wheel to zoom, drag to pan, double-click to reset";
      draw();
    }
    tl.windows.forEach(function (w, i) {
      var b = el("button", "", w.label + " #" + w.step);
      b.addEventListener("click", function () { select(i); });
      bar.appendChild(b);
    });
    var LABEL = 140, RH = 16;
    function layout() {
      var y = 4, out = [];
      rows.forEach(function (r) { out.push({ r: r, y: y }); y += r.depth * RH + 8; });
      return { rows: out, h: y + 4 };
    }
    var boxes = [];
    function draw() {
      var lay = layout();
      var W = canvas.clientWidth || 900;
      var dpr = window.devicePixelRatio || 1;
      canvas.width = W * dpr; canvas.height = lay.h * dpr;
      canvas.style.height = lay.h + "px";
      var c = canvas.getContext("2d");
      c.setTransform(dpr, 0, 0, dpr, 0, 0);
      c.clearRect(0, 0, W, lay.h);
      c.font = "11px sans-serif";
      c.textBaseline = "middle";
      boxes = [];
      var scale = (W - LABEL - 4) / (view[1] - view[0]);
      lay.rows.forEach(function (lr) {
        c.fillStyle = "#475467";
        c.fillText(lr.r.name.slice(0, 22), 4, lr.y + RH / 2);
        c.strokeStyle = "#e3e6ea";
        c.beginPath(); c.moveTo(0, lr.y + lr.r.depth * RH + 4); c.lineTo(W, lr.y + lr.r.depth * RH + 4); c.stroke();
        lr.r.its.forEach(function (it) {
          var x0 = LABEL + (it[1] - view[0]) * scale, x1 = LABEL + (it[1] + it[2] - view[0]) * scale;
          if (x1 < LABEL || x0 > W) return;
          x0 = Math.max(x0, LABEL); x1 = Math.min(x1, W);
          var w = Math.max(x1 - x0, 1), y = lr.y + it[3] * RH;
          c.fillStyle = colors[it[4]] || "#9aa5b1";
          c.fillRect(x0, y, w, RH - 2);
          if (w > 30) { c.fillStyle = "#fff"; c.save(); c.beginPath(); c.rect(x0, y, w, RH); c.clip(); c.fillText(it[5], x0 + 3, y + RH / 2 - 1); c.restore(); }
          boxes.push([x0, y, w, RH - 2, it]);
        });
      });
      canvas.setAttribute("data-items", String(boxes.length));
    }
    canvas.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var W = canvas.clientWidth, rect = canvas.getBoundingClientRect();
      var f = Math.max(0, Math.min(1, (ev.clientX - rect.left - LABEL) / (W - LABEL)));
      var span = view[1] - view[0], at = view[0] + f * span;
      var ns = Math.max(span * (ev.deltaY > 0 ? 1.25 : 0.8), 100);
      view = [at - f * ns, at - f * ns + ns];
      draw();
    }, { passive: false });
    var drag = null;
    canvas.addEventListener("mousedown", function (ev) { drag = [ev.clientX, view[0], view[1]]; });
    window.addEventListener("mouseup", function () { drag = null; });
    canvas.addEventListener("dblclick", function () { select(cur); });
    canvas.addEventListener("mousemove", function (ev) {
      var rect = canvas.getBoundingClientRect(), x = ev.clientX - rect.left, y = ev.clientY - rect.top;
      if (drag) {
        var d = (ev.clientX - drag[0]) / (canvas.clientWidth - LABEL) * (drag[2] - drag[1]);
        view = [drag[1] - d, drag[2] - d];
        draw();
        return;
      }
      for (var i = boxes.length - 1; i >= 0; i--) {
        var b = boxes[i];
        if (x >= b[0] && x <= b[0] + b[2] && y >= b[1] && y <= b[1] + b[3]) {
          showTip(ev, b[4][4] + ": " + b[4][5] + " \u2014 " + fmtNs(b[4][2]));
          return;
        }
      }
      hideTip();
    });
    canvas.addEventListener("mouseleave", hideTip);
    window.addEventListener("resize", draw);
    select(0);
  })();

  // Flamegraphs (icicle, click to zoom, search).
  (function () {
    var host = document.getElementById("flame");
    var tabs = el("div", "tabs");
    var tools = el("div", "tools");
    var search = document.createElement("input");
    search.type = "search";
    search.placeholder = "search frames";
    var reset = el("button", "", "reset zoom");
    tools.appendChild(search);
    tools.appendChild(reset);
    var box = el("div", "flame");
    box.id = "flame-box";
    var info = el("div", "info");
    host.appendChild(tabs);
    host.appendChild(tools);
    host.appendChild(box);
    host.appendChild(info);
    var kinds = [["host", "host wall time"], ["gpu", "GPU time by issuing host stack"]];
    var kind = "host", focus = null;
    function hue(name) {
      var h = 0;
      for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
      return "hsl(" + (20 + h % 40) + "," + (60 + h % 30) + "%," + (62 + h % 12) + "%)";
    }
    function render() {
      box.textContent = "";
      var root = D.flames[kind];
      if (!root || !root[1]) { box.appendChild(el("p", "empty", "No " + (kind === "gpu" ? "GPU" : "host") + " time recorded.")); box.style.height = "auto"; return; }
      var path = focus || [root];
      var top = path[path.length - 1];
      var W = box.clientWidth || 900, FH = 18, maxDepth = 0, frames = 0, q = search.value;
      var matched = 0;
      function place(node, x, w, depth) {
        if (w < 0.5) return;
        maxDepth = Math.max(maxDepth, depth);
        var f = el("div", "frame", node[0]);
        f.style.left = x + "px";
        f.style.width = Math.max(w - 1, 1) + "px";
        f.style.top = (depth * FH) + "px";
        f.style.background = hue(node[0]);
        if (q && node[0].indexOf(q) >= 0) { f.className += " match"; matched += node[1]; }
        var pct = (100 * node[1] / root[1]).toFixed(2);
        f.addEventListener("mousemove", function (ev) { showTip(ev, node[0] + " \u2014 " + fmtNs(node[1]) + " (" + pct + " % of all)"); });
        f.addEventListener("mouseleave", hideTip);
        f.addEventListener("click", function () { focus = chain(node); render(); });
        box.appendChild(f);
        frames++;
        var cx = x;
        (node[2] || []).forEach(function (ch) {
          var cw = w * ch[1] / node[1];
          place(ch, cx, cw, depth + 1);
          cx += cw;
        });
      }
      // Ancestors of the focused frame span the full width.
      for (var i = 0; i < path.length - 1; i++) {
        var a = el("div", "frame", path[i][0]);
        a.style.left = "0px"; a.style.width = (W - 1) + "px"; a.style.top = (i * FH) + "px";
        a.style.background = "#dde3ea";
        (function (k) { a.addEventListener("click", function () { focus = k === 0 ? null : path.slice(0, k + 1); render(); }); })(i);
        box.appendChild(a);
        frames++;
      }
      place(top, 0, W, path.length - 1);
      box.style.height = ((maxDepth + 1) * FH + 4) + "px";
      box.setAttribute("data-frames", String(frames));
      info.textContent = (kind === "gpu" ? "GPU" : "host") + " total " + fmtNs(root[1]) +
        (q ? " \u00b7 matched " + fmtNs(matched) : "") + " \u00b7 click a frame to zoom";
    }
    function chain(node) {
      // Path from the root to node.
      var root = D.flames[kind], out = [];
      function walk(n, acc) {
        acc.push(n);
        if (n === node) { out = acc.slice(); return true; }
        var ch = n[2] || [];
        for (var i = 0; i < ch.length; i++) if (walk(ch[i], acc)) return true;
        acc.pop();
        return false;
      }
      walk(root, []);
      return out.length > 1 ? out : null;
    }
    kinds.forEach(function (k) {
      var b = el("button", k[0] === kind ? "active" : "", k[1]);
      b.addEventListener("click", function () {
        kind = k[0]; focus = null;
        Array.prototype.forEach.call(tabs.children, function (x) { x.className = ""; });
        b.className = "active";
        render();
      });
      tabs.appendChild(b);
    });
    search.addEventListener("input", render);
    reset.addEventListener("click", function () { focus = null; render(); });
    render();
  })();

  // Sortable tables.
  function table(hostId, t) {
    var host = document.getElementById(hostId);
    if (!t.rows.length) { host.appendChild(el("p", "empty", t.empty)); return; }
    var wrap = el("div", "tablewrap");
    var tb = el("table");
    var thead = el("thead"), tr = el("tr"), tbody = el("tbody");
    var sortCol = -1, asc = true;
    t.columns.forEach(function (c, i) {
      var th = el("th", "", c[0]);
      th.addEventListener("click", function () {
        if (sortCol === i) asc = !asc; else { sortCol = i; asc = c[1] === "text"; }
        Array.prototype.forEach.call(tr.children, function (x) { x.className = ""; });
        th.className = asc ? "sorted-asc" : "sorted-desc";
        var rows = t.rows.slice().sort(function (a, b) {
          var x = a[i], y = b[i];
          var r = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
          return asc ? r : -r;
        });
        fill(rows);
      });
      tr.appendChild(th);
    });
    function fill(rows) {
      tbody.textContent = "";
      rows.forEach(function (r) {
        var row = el("tr");
        t.columns.forEach(function (c, i) { row.appendChild(el("td", "", fmt(c[1], r[i]))); });
        tbody.appendChild(row);
      });
    }
    thead.appendChild(tr);
    tb.appendChild(thead);
    tb.appendChild(tbody);
    fill(t.rows);
    wrap.appendChild(tb);
    host.appendChild(wrap);
  }
  table("spans-table", D.tables.spans);
  table("kernels-table", D.tables.kernels);
  table("copies-table", D.tables.copies);
  table("syncs-table", D.tables.syncs);
  if (D.tables.ranks) table("ranks-table", D.tables.ranks);
  else document.getElementById("ranks").style.display = "none";
  if (D.ranks_note) document.getElementById("ranks-note").textContent = D.ranks_note;

  // Findings, one group per rule: the costliest rule first (largest measured share of step
  // time), then errors before warnings before notes, then by code. A group shows its help
  // once; rules with measured or confirmed findings, or only a few, start open.
  (function () {
    var host = document.getElementById("findings");
    if (!D.findings.length) { host.appendChild(el("p", "empty", "No findings.")); return; }
    var rank = { error: 2, warning: 1, note: 0 };
    var groups = [], byCode = {};
    D.findings.forEach(function (f) {
      var g = byCode[f.code];
      if (!g) {
        g = byCode[f.code] = { code: f.code, name: f.name, help: f.help, severity: f.severity,
          items: [], runtime: 0, lint: 0, confirmed: 0, share: null, perStep: null };
        groups.push(g);
      }
      g.items.push(f);
      if (rank[f.severity] > rank[g.severity]) g.severity = f.severity;
      if (f.origin === "runtime") g.runtime++; else g.lint++;
      if (f.confirmed) g.confirmed++;
      if (f.share_of_step_percent != null) g.share = (g.share || 0) + f.share_of_step_percent;
      if (f.cost_per_step_ns != null) g.perStep = (g.perStep || 0) + f.cost_per_step_ns;
    });
    function measured(f) { return f.share_of_step_percent != null ? f.share_of_step_percent : -1; }
    groups.forEach(function (g) {
      g.items.sort(function (a, b) {
        return measured(b) - measured(a) || (b.confirmed ? 1 : 0) - (a.confirmed ? 1 : 0) ||
          String(a.location || "").localeCompare(String(b.location || ""), undefined, { numeric: true });
      });
    });
    groups.sort(function (a, b) {
      return (b.share == null ? -1 : b.share) - (a.share == null ? -1 : a.share) ||
        rank[b.severity] - rank[a.severity] || a.code.localeCompare(b.code);
    });
    host.setAttribute("data-groups", groups.length);
    var counts = el("p", "info", D.findings.length + (D.findings.length === 1 ? " finding" : " findings") +
      " under " + groups.length + (groups.length === 1 ? " rule" : " rules"));
    host.appendChild(counts);
    function cost(f) {
      var c = [];
      if (f.cost_per_step_ns != null) c.push(fmtNs(f.cost_per_step_ns) + " per step");
      if (f.share_of_step_percent != null) c.push(f.share_of_step_percent.toFixed(1) + " % of step time");
      if (f.bytes != null) c.push(fmtBytes(f.bytes));
      if (f.count != null) c.push(f.count + " times");
      return c.join(", ");
    }
    groups.forEach(function (g) {
      var d = el("details", "finding " + g.severity);
      d.setAttribute("data-code", g.code);
      if (g.runtime || g.confirmed || g.items.length <= 3) d.open = true;
      var s = el("summary");
      s.appendChild(el("span", "code", g.code + " " + g.name));
      var parts = [g.severity, g.items.length + (g.items.length === 1 ? " finding" : " findings")];
      if (g.runtime) parts.push(g.runtime + " measured");
      if (g.lint) parts.push(g.lint + " in the source");
      if (g.confirmed) parts.push(g.confirmed + " confirmed at run time");
      if (g.perStep != null) parts.push(fmtNs(g.perStep) + " per step" +
        (g.share != null ? " (" + g.share.toFixed(1) + " % of step time)" : ""));
      s.appendChild(document.createTextNode(" \u00b7 " + parts.join(" \u00b7 ")));
      d.appendChild(s);
      if (g.help) d.appendChild(el("div", "info", "help: " + g.help));
      var list = el("ul", "items");
      g.items.forEach(function (f) {
        var li = el("li", f.confirmed ? "confirmed" : "");
        var head = el("div");
        head.appendChild(el("span", "where", f.location || "(no source line)"));
        head.appendChild(document.createTextNode(" \u00b7 " + (f.origin || "") +
          (f.confirmed ? " \u00b7 confirmed at run time" : "") +
          (f.severity !== g.severity ? " \u00b7 " + f.severity : "")));
        li.appendChild(head);
        li.appendChild(el("div", "", f.message));
        var c = cost(f);
        if (c) li.appendChild(el("div", "info", "cost: " + c));
        if (f.help && f.help !== g.help) li.appendChild(el("div", "info", "help: " + f.help));
        list.appendChild(li);
      });
      d.appendChild(list);
      host.appendChild(d);
    });
  })();
  document.body.setAttribute("data-rendered", "true");
})();

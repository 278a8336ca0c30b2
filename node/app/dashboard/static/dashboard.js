// The dashboard page: fetch api/dashboard every few seconds and redraw. Everything shown came from peers of the
// swarm, so nothing here writes markup: every value goes into the page through textContent, never innerHTML.
"use strict";

const REFRESH_MS = 3000;
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#0a7b83", "#e16f24", "#6e7781"];
const charts = {};

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function setText(id, value) {
  const e = document.getElementById(id);
  if (e) e.textContent = value;
}

function fmtInt(v) { return v === null || v === undefined ? "–" : Math.round(v).toLocaleString("en-US"); }
function fmtLoss(v) { return v === null || v === undefined ? "–" : Number(v).toFixed(4); }
function fmtBytes(v) {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB", "PB"];
  let i = 0, x = Number(v);
  while (Math.abs(x) >= 1000 && i < units.length - 1) { x /= 1000; i++; }
  return (i === 0 ? String(Math.round(x)) : x.toFixed(1)) + " " + units[i];
}
function fmtAgree(v) { return v === true ? "yes" : v === false ? "NO" : "–"; }
function short(id) { return id.length > 12 ? "…" + id.slice(-8) : id; }

function fillRows(tbody, rows) {
  // Replace a table body's rows; each row is a list of [text, attributes] cells.
  while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
  for (const row of rows) {
    const tr = document.createElement("tr");
    for (const [text, attrs] of row) {
      const td = el("td", text);
      for (const [k, v] of Object.entries(attrs || {})) {
        if (k === "class") td.className = v; else td.setAttribute(k, v);
      }
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
}

function moduleCell(cell) {
  const td = document.createElement("td");
  td.setAttribute("data-module", cell.module);
  td.appendChild(el("div", cell.module, "cell-id"));
  const r = el("div", "round " + (cell.round === null ? "–" : cell.round));
  r.setAttribute("data-field", "round");
  r.title = "Newest outer round any holder announced for this module";
  td.appendChild(r);
  const agree = el("div", "replicas agree: " + fmtAgree(cell.replicas_agree),
                   cell.replicas_agree === false ? "no" : cell.replicas_agree ? "yes" : "");
  agree.setAttribute("data-field", "replicas-agree");
  agree.title = "yes: every round two or more holders announced has one digest; NO: a round has two; –: nothing to compare yet";
  td.appendChild(agree);
  const holders = el("div", cell.holders.length + " holder(s): " + cell.holders.map(short).join(", "), "cell-holders");
  holders.setAttribute("data-field", "holders");
  holders.title = "Peers that announce holding this module (the ends of their peer ids)";
  td.appendChild(holders);
  return td;
}

function drawGrid(data) {
  const shared = document.getElementById("shared-cell");
  while (shared.firstChild) shared.removeChild(shared.firstChild);
  if (data.shared) {
    const t = document.createElement("table");
    t.className = "grid";
    const tr = document.createElement("tr");
    tr.appendChild(el("th", "shared")).title = "The module every path shares";
    tr.appendChild(moduleCell(data.shared));
    t.appendChild(tr);
    shared.appendChild(t);
  }
  const tbody = document.querySelector("#grid tbody");
  while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
  data.grid.forEach((level, i) => {
    const tr = document.createElement("tr");
    tr.appendChild(el("th", "level " + i)).title = "Level " + i + " of the grid: a path takes one of its modules";
    for (const cell of level) tr.appendChild(moduleCell(cell));
    tbody.appendChild(tr);
  });
}

function alignSeries(curves) {
  // uPlot wants one x array and aligned y arrays: the union of x values, null where a curve has no point.
  const xs = Array.from(new Set(curves.flatMap(c => c.points.map(p => p[0])))).sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = curves.map(c => {
    const y = new Array(xs.length).fill(null);
    for (const [x, v] of c.points) y[index.get(x)] = v;
    return y;
  });
  return [xs, ...ys];
}

function newestIdxs(u) {
  // Per series, the index of its newest value (series end at different rounds).
  return u.data.map(ys => {
    for (let j = ys.length - 1; j >= 0; j--) if (ys[j] !== null && ys[j] !== undefined) return j;
    return null;
  });
}

function legendShowsNewest(u) {
  // uPlot's legend reads "--" whenever the cursor is off the chart: show each series' newest value instead, so the
  // figures are there without hovering (hovering still shows the point under the cursor).
  if (u.cursor.idx === null || u.cursor.idx === undefined) u.setLegend({idxs: newestIdxs(u)});
}

function showEmpty(box, id, title, message) {
  // Before the first round a chart would be an empty frame with meaningless ticks: say why it is empty instead.
  if (charts[id]) { charts[id].plot.destroy(); delete charts[id]; }
  let p = box.querySelector(".empty");
  if (!p) {
    while (box.firstChild) box.removeChild(box.firstChild);
    p = box.appendChild(el("p", "", "empty"));
  }
  p.textContent = title + ": " + message;
}

// opts: empty (the message while no curve has a point), fmt (a y value as the legend writes it), time (x is Unix
// time), yRange (uPlot's range function for y), styles (per-curve series options, e.g. dashes).
function drawChart(id, title, xLabel, yLabel, curves, opts) {
  const box = document.getElementById(id);
  if (!box || typeof uPlot === "undefined") return;
  opts = opts || {};
  if (!curves.some(c => c.points.some(p => p[1] !== null && p[1] !== undefined))) {
    showEmpty(box, id, title, opts.empty || "no data yet");
    return;
  }
  const empty = box.querySelector(".empty");
  if (empty) box.removeChild(empty);
  const key = curves.map(c => c.label).join("\u0000");
  const data = alignSeries(curves);
  const existing = charts[id];
  if (existing && existing.key === key) {
    existing.plot.setData(data);
    legendShowsNewest(existing.plot);
    return;
  }
  if (existing) existing.plot.destroy();
  const fmt = opts.fmt || (v => String(v));
  // With the cursor off the chart each series shows its own newest value: one that ends before the chart's last
  // round says which round its value is from.
  const value = (u, v, si, idx) => v === null || v === undefined ? "–" : fmt(v) +
    (!opts.time && u.cursor.idx == null && idx !== null && idx < u.data[0].length - 1 ? " (round " + u.data[0][idx] + ")" : "");
  const series = [opts.time ? {label: xLabel} : {label: xLabel, value: (u, v) => v === null ? "–" : String(v)}].concat(curves.map((c, i) => ({
    label: c.label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, value: value,
    ...((opts.styles || [])[i] || {}),
  })));
  const width = Math.max(320, Math.min(1100, box.clientWidth || 900));
  const plot = new uPlot({
    title: title, width: width, height: 240, series: series,
    scales: {
      // a time axis spans at least a minute: one poll alone would otherwise tick every half second
      x: opts.time ? {time: true, range: (u, min, max) => [min, Math.max(max, min + 60)]} : {time: false},
      y: opts.yRange ? {range: opts.yRange} : {},
    },
    // rounds are whole numbers: no tick at 1.5
    axes: [opts.time ? {label: xLabel} : {label: xLabel, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]},
           {label: yLabel, size: 70, ...(opts.yIncrs ? {incrs: opts.yIncrs} : {})}],
    hooks: {setCursor: [legendShowsNewest], ready: [legendShowsNewest]},
  }, data, box);
  charts[id] = {plot: plot, key: key};
}

const DASHES = [[], [10, 4], [3, 3], [12, 3, 3, 3], [6, 6], [1, 4]];

function drawGroupChart(modules) {
  // Modules often merge groups of the same size, so their lines would lie exactly on top of each other: each gets
  // a dash pattern, a point size, and a vertical offset (sizes are whole numbers: the offsets stay within ±0.3 of
  // them, the axis ticks whole numbers only, and the legend shows the true size).
  const shown = modules.filter(m => m.group_sizes.length);
  const step = shown.length > 1 ? Math.min(0.15, 0.6 / (shown.length - 1)) : 0;
  const curves = shown.map((m, i) => {
    const off = (i - (shown.length - 1) / 2) * step;
    return {label: m.module, points: m.group_sizes.map(([r, n]) => [r, n + off])};
  });
  drawChart("group-chart", "members merged per round, per module (lines offset up to ±0.3 to stay apart)",
            "outer round", "members merged", curves, {
              empty: "no round finished yet: each module's group size shows here once a round merges",
              fmt: v => String(Math.round(v)), yIncrs: [1, 2, 5, 10, 20, 50, 100],
              yRange: (u, min, max) => [Math.max(0, Math.floor(min - 0.5)), Math.ceil(max + 0.5)],
              styles: curves.map((c, i) => ({dash: DASHES[i % DASHES.length], points: {size: 5 + 2 * (i % 3)}})),
            });
}

function reachability(t) {
  // Nothing published yet is "not measured yet", not "0 / 0 / 0" beside a count of live nodes.
  if (t.nodes_reporting === undefined) return "–";
  if (!t.nodes_reporting) return "not measured yet";
  const unknown = t.nodes_reporting - t.nodes_reachable - t.nodes_behind_nat;
  const parts = [t.nodes_reachable + " reachable", t.nodes_behind_nat + " behind NAT"];
  if (unknown > 0) parts.push(unknown + " unknown");
  if (t.nodes > t.nodes_reporting) parts.push((t.nodes - t.nodes_reporting) + " not reported yet");
  return parts.join(" · ");
}

function drawTotals(data) {
  const t = data.totals || {};
  setText("total-nodes", fmtInt(t.nodes));
  setText("total-paths-served", t.paths_served === undefined ? "–" : t.paths_served + " / " + data.swarm.n_paths);
  setText("total-tokens-per-s", fmtInt(t.tokens_per_s));
  setText("total-tokens-trained", fmtInt(t.tokens_trained));
  setText("total-bytes-sent", fmtBytes(t.bytes_sent));
  setText("total-ddp", fmtBytes(t.ddp_fp32_bytes));
  setText("total-ratio", t.bytes_vs_ddp ? Math.round(t.bytes_vs_ddp).toLocaleString("en-US") + "×" : "–");
  setText("total-reachability", reachability(t));
}

const NO_ROUND = "no round finished yet: the curve starts with the first round";

function drawLossLabels(loss) {
  // The loss's unit and meaning come from the server (view.py), the same words as /metrics' help.
  const unit = " (" + loss.unit + ")";
  setText("loss-text", loss.definition + ".");
  const cap = t => t.charAt(0).toUpperCase() + t.slice(1);
  setText("paths-hint", "Two losses, labelled apart. " + cap(loss.latest) + ". " + cap(loss.per_round) + ".");
  for (const [id, text, why] of [["th-loss-latest", "latest loss", loss.latest],
                                 ["th-loss-round", "last round's loss", loss.per_round],
                                 ["node-loss-label", "latest loss", "this node's newest reported loss"]]) {
    setText(id, text + unit);
    const e = document.getElementById(id);
    if (e) e.title = loss.definition + "; " + why;
  }
}

function drawNode(node, loss) {
  const section = document.getElementById("node-section");
  if (!node) { section.hidden = true; return; }
  section.hidden = false;
  setText("node-peer", node.peer_id);
  setText("node-path", node.path);
  setText("node-state", node.state);
  setText("node-round", fmtInt(node.round));
  setText("node-inner-step", fmtInt(node.inner_step));
  setText("node-loss", fmtLoss(node.loss));
  setText("node-tokens-per-s", fmtInt(node.tokens_per_s));
  setText("node-bytes", fmtBytes(node.bytes_sent) + " / " + fmtBytes(node.bytes_received));
  fillRows(document.querySelector("#node-groups tbody"), Object.entries(node.last_groups).map(([mid, g]) => [
    [mid, {"data-module": mid}], [g.round], [g.peers.map(short).join(", ")]]));
  drawChart("node-loss-chart", "this node's loss per round (" + loss.unit + ")", "outer round",
            "loss (" + loss.unit + ")", [{label: "loss", points: node.loss_by_round}], {empty: NO_ROUND, fmt: fmtLoss});
}

function lastPoint(points) { return points.length ? points[points.length - 1] : null; }

function draw(data) {
  const loss = data.loss;
  document.title = "pathswarm · " + data.swarm.name;
  setText("swarm-name", data.swarm.name);
  setText("swarm-id", data.swarm.id);
  setText("swarm-kind", (data.swarm.private ? "private swarm (members only)" : "open swarm (anyone may join)") +
          " · levels " + data.swarm.levels.join("×") + " · " + data.swarm.n_paths + " paths");
  setText("updated", data.updated ? "updated " + new Date(data.updated * 1000).toLocaleTimeString() +
          " · records read " + data.polls + " times" : "waiting for the swarm's records…");
  const err = document.getElementById("error");
  err.hidden = !data.error;
  err.textContent = data.error ? "last poll failed: " + data.error : "";
  drawLossLabels(loss);
  drawTotals(data);
  drawNode(data.node, loss);
  drawGrid(data);
  fillRows(document.querySelector("#paths tbody"), data.paths.map(p => {
    // the loss chart's last point, so the table and the chart show one figure side by side
    const last = lastPoint(p.loss_by_round);
    return [
      [p.path, {"data-path": p.path}], [p.n_nodes, {"data-field": "nodes"}],
      [fmtInt(p.tokens_per_s), {"data-field": "tokens-per-s"}], [p.round === null ? "–" : p.round, {"data-field": "round"}],
      [fmtLoss(p.loss), {"data-field": "loss"}],
      [last ? fmtLoss(last[1]) : "–", {"data-field": "round-loss", title: last ? "round " + last[0] : "no round yet"}]];
  }));
  fillRows(document.querySelector("#modules tbody"), data.modules.map(m => [
    [m.module, {"data-module": m.module}], [m.round === null ? "–" : m.round, {"data-field": "round"}],
    [m.holders, {"data-field": "holders"}], [m.holders_at_round, {"data-field": "holders-at-round"}],
    [fmtAgree(m.replicas_agree), {"data-field": "replicas-agree", "class": m.replicas_agree === false ? "no" : ""}],
    [m.split_rounds.length ? m.split_rounds.join(", ") : "–", {"data-field": "split-rounds"}],
    [m.rounds_late, {"data-field": "late"}], [m.rounds_failed, {"data-field": "failed"}],
    [m.group_sizes.length ? m.group_sizes[m.group_sizes.length - 1][1] : "–", {"data-field": "group"}],
    [m.left_behind.length ? m.left_behind.map(([p, what]) => p.slice(-8) + " " + what).join(", ") : "–",
     {"data-field": "left-behind", "class": m.left_behind.length ? "no" : ""}],
    [m.splits_healed ? m.splits_healed + " (≤ " + m.settle_rounds_max + " rounds)" : "–",
     {"data-field": "splits-healed"}]]));
  drawChart("loss-chart", "loss per round, per path (" + loss.unit + ")", "outer round", "loss (" + loss.unit + ")",
            data.paths.filter(p => p.loss_by_round.length).map(p => ({label: "path " + p.path, points: p.loss_by_round})),
            {empty: NO_ROUND, fmt: fmtLoss});
  drawGroupChart(data.modules);
  const s = data.series;
  // all zero until a node finishes a round: that is "nothing yet", not a flat line worth drawing
  const rate = s.tokens_per_s.some(v => v > 0) ? [{label: "tokens/s", points: s.t.map((t, i) => [t, s.tokens_per_s[i]])}] : [];
  drawChart("rate-chart", "tokens/s over time, all nodes", "time", "tokens/s", rate, {
    time: true, fmt: fmtInt, yRange: (u, min, max) => [0, max > 0 ? max * 1.1 : 1],
    empty: "no throughput yet: a node reports its tokens/s once it finishes its first round"});
  document.body.setAttribute("data-polls", String(data.polls));
}

async function refresh() {
  try {
    const r = await fetch("api/dashboard", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    draw(await r.json());
    document.body.setAttribute("data-ok", "1");
  } catch (e) {
    const err = document.getElementById("error");
    err.hidden = false;
    err.textContent = "dashboard unreachable: " + e.message;
  }
}

refresh();
setInterval(refresh, REFRESH_MS);

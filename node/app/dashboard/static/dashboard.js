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
  td.appendChild(r);
  const agree = el("div", "replicas agree: " + fmtAgree(cell.replicas_agree),
                   cell.replicas_agree === false ? "no" : cell.replicas_agree ? "yes" : "");
  agree.setAttribute("data-field", "replicas-agree");
  td.appendChild(agree);
  const holders = el("div", cell.holders.length + " holder(s): " + cell.holders.map(short).join(", "), "cell-holders");
  holders.setAttribute("data-field", "holders");
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
    tr.appendChild(el("th", "shared"));
    tr.appendChild(moduleCell(data.shared));
    t.appendChild(tr);
    shared.appendChild(t);
  }
  const tbody = document.querySelector("#grid tbody");
  while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
  data.grid.forEach((level, i) => {
    const tr = document.createElement("tr");
    tr.appendChild(el("th", "level " + i));
    for (const cell of level) tr.appendChild(moduleCell(cell));
    tbody.appendChild(tr);
  });
}

function alignSeries(curves) {
  // uPlot wants one x array and aligned y arrays: the union of rounds, null where a curve has no point.
  const xs = Array.from(new Set(curves.flatMap(c => c.points.map(p => p[0])))).sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = curves.map(c => {
    const y = new Array(xs.length).fill(null);
    for (const [x, v] of c.points) y[index.get(x)] = v;
    return y;
  });
  return [xs, ...ys];
}

function drawChart(id, title, xLabel, yLabel, curves, opts) {
  const box = document.getElementById(id);
  if (!box || typeof uPlot === "undefined") return;
  const key = curves.map(c => c.label).join("\u0000");
  const data = curves.length ? alignSeries(curves) : [[]];
  const width = Math.max(320, Math.min(1100, box.clientWidth || 900));
  const existing = charts[id];
  if (existing && existing.key === key) {
    existing.plot.setData(data);
    return;
  }
  if (existing) existing.plot.destroy();
  const series = [{label: xLabel}].concat(curves.map((c, i) => ({
    label: c.label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true, points: {show: false},
  })));
  const plot = new uPlot({
    title: title, width: width, height: 240, series: series,
    scales: {x: {time: (opts || {}).time === true}},
    // rounds are whole numbers: no tick at 1.5
    axes: [(opts || {}).time ? {label: xLabel} : {label: xLabel, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]},
           {label: yLabel, size: 70}],
  }, data, box);
  charts[id] = {plot: plot, key: key};
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
  const unknown = (t.nodes_reporting || 0) - (t.nodes_reachable || 0) - (t.nodes_behind_nat || 0);
  setText("total-reachability", t.nodes_reporting === undefined ? "–" :
          t.nodes_reachable + " / " + t.nodes_behind_nat + " / " + unknown);
}

function drawNode(node) {
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
  drawChart("node-loss-chart", "this node's training loss", "outer round", "loss",
            [{label: "loss", points: node.loss_by_round}]);
}

function draw(data) {
  document.title = "pathswarm · " + data.swarm.name;
  setText("swarm-name", data.swarm.name);
  setText("swarm-id", data.swarm.id);
  setText("swarm-kind", (data.swarm.private ? "private" : "open") + " · levels " + data.swarm.levels.join("×") +
          " · " + data.swarm.n_paths + " paths");
  setText("updated", data.updated ? "updated " + new Date(data.updated * 1000).toLocaleTimeString() +
          " · poll " + data.polls : "waiting for the swarm's records…");
  const err = document.getElementById("error");
  err.hidden = !data.error;
  err.textContent = data.error ? "last poll failed: " + data.error : "";
  drawTotals(data);
  drawNode(data.node);
  drawGrid(data);
  fillRows(document.querySelector("#paths tbody"), data.paths.map(p => [
    [p.path, {"data-path": p.path}], [p.n_nodes, {"data-field": "nodes"}],
    [fmtInt(p.tokens_per_s), {"data-field": "tokens-per-s"}], [p.round === null ? "–" : p.round, {"data-field": "round"}],
    [fmtLoss(p.loss), {"data-field": "loss"}]]));
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
  drawChart("loss-chart", "training loss per path", "outer round", "loss",
            data.paths.filter(p => p.loss_by_round.length).map(p => ({label: "path " + p.path, points: p.loss_by_round})));
  drawChart("group-chart", "group size per module", "outer round", "members merged",
            data.modules.filter(m => m.group_sizes.length).map(m => ({label: m.module, points: m.group_sizes})));
  const s = data.series;
  drawChart("rate-chart", "tokens/s over time", "time", "tokens/s",
            [{label: "tokens/s", points: s.t.map((t, i) => [t, s.tokens_per_s[i]])}], {time: true});
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

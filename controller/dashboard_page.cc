// The dashboard's page (controller/dashboard.h): plain HTML, CSS and JavaScript, inline,
// nothing fetched from elsewhere. Curves are drawn as SVG from the jobs' progress events:
// real axes (nice ticks, grid), the value under the pointer, TensorBoard's smoothing (a
// debiased moving average, the raw curve faded behind), a log scale, each attempt its own
// line with a marker where it starts (an attempt that re-runs steps from a checkpoint does
// not draw back over the one before), and other jobs overlaid for comparison. The page's
// state lives in the URL fragment (#job=ID&compare=ID,ID&smooth=0.6&log=1), so a view can
// be shared; a token given there (#token=...) moves to the tab's sessionStorage at once.
#include "controller/dashboard.h"

namespace tessera::controller {

const char kDashboardPage[] = R"PAGE(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tessera</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
*{box-sizing:border-box}
body{font:13px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330;overflow-x:hidden}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:16px;margin:0}header span{color:#aab}
#banner{display:none;background:#c62828;color:#fff;padding:6px 16px;font-weight:600}
main{display:grid;grid-template-columns:minmax(0,2fr) minmax(0,3fr);gap:12px;padding:12px}
@media (max-width:1000px){main{grid-template-columns:minmax(0,1fr)}}
section{background:#fff;border:1px solid #dde;border-radius:6px;padding:8px 12px;min-width:0}
h2{font-size:13px;margin:4px 0 8px;text-transform:uppercase;color:#667;letter-spacing:.04em;overflow-wrap:anywhere}
table{border-collapse:collapse;width:100%;table-layout:fixed}td,th{text-align:left;padding:3px 6px;border-bottom:1px solid #eef;
overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
th{position:sticky;top:0;background:#fff}
.scroll{max-height:46vh;overflow:auto}
tr.job{cursor:pointer}tr.job:hover{background:#f0f3ff}tr.sel{background:#e3e9ff}
.mono{font-family:ui-monospace,monospace;font-size:12px}
.st{font-weight:600}.RUNNING{color:#1a7f37}.SUCCEEDED{color:#0b5cad}.FAILED{color:#c62828}
.PENDING,.PLACING,.STARTING,.RESTARTING{color:#b26a00}.STOPPED{color:#666}.READY{color:#1a7f37}.LOST{color:#c62828}
.reason{color:#667}
#reason{white-space:pre-wrap;overflow-wrap:anywhere;margin:4px 0;padding:6px 8px;border-radius:4px;background:#f6f7f9}
#reason.FAILED{background:#fdecea;color:#8a1c1c}#reason:empty{display:none}
.filters{display:flex;gap:6px;margin-bottom:6px;flex-wrap:wrap}.filters input{flex:1;min-width:120px}
.dev{display:inline-block;width:10px;height:10px;margin:1px;border-radius:2px;background:#cfd6e4}.dev.used{background:#3b82f6}
.controls{display:flex;gap:14px;align-items:center;margin:6px 0;flex-wrap:wrap;color:#445}
#legend span{margin-right:12px;overflow-wrap:anywhere}#legend i{display:inline-block;width:14px;height:3px;vertical-align:middle;margin-right:4px}
#charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:8px}
.chart{border:1px solid #eef;border-radius:4px;padding:4px;position:relative;min-width:0}.chart b{font-size:12px;overflow-wrap:anywhere}
.chart .now{color:#667;margin-left:6px}
svg.curve{width:100%;height:auto;display:block}
svg.curve polyline{fill:none;stroke-width:1.6}svg.curve polyline.raw{stroke-width:1;opacity:.25}
svg.curve text{font-size:10px;fill:#667}svg.curve line.grid{stroke:#eef}svg.curve line.axis{stroke:#99a}
svg.curve line.attempt-mark{stroke:#b26a00;stroke-dasharray:3 3}svg.curve text.attempt-label{fill:#b26a00}
svg.curve line.cursor{stroke:#667;stroke-dasharray:2 2}
.tip{position:absolute;pointer-events:none;background:#1d2330;color:#fff;padding:2px 6px;border-radius:3px;font-size:11px;display:none;
max-width:calc(100% - 8px);overflow-wrap:anywhere}
#results table{font-size:12px}#results td,#results th{white-space:nowrap}
pre{background:#11151c;color:#d7dce5;padding:8px;max-height:260px;overflow:auto;font-size:11px;margin:0;white-space:pre-wrap;overflow-wrap:anywhere}
#login{display:none;padding:24px}#login input{width:360px;max-width:100%}
</style></head><body>
<header><h1>Tessera</h1><span id="version"></span><span id="updated"></span></header>
<div id="banner"></div>
<div id="login"><p>This dashboard reads through the controller's API: paste a token (any role).</p>
<input id="token" type="password" placeholder="token"> <button id="go">Open</button> <span id="loginerr"></span></div>
<main id="main" style="display:none">
<div style="min-width:0">
<section><h2>Nodes</h2><div class="scroll" style="max-height:24vh"><table id="nodes"><colgroup><col style="width:40%"><col style="width:20%"><col></colgroup>
<thead><tr><th>node</th><th>state</th><th>devices</th></tr></thead><tbody></tbody></table></div></section>
<section style="margin-top:12px"><h2>Jobs <span id="jobcount"></span></h2>
<div class="filters"><input id="filter" placeholder="filter by id or name"><select id="statefilter"><option value="">every state</option>
<option>RUNNING</option><option>PENDING</option><option>RESTARTING</option><option>SUCCEEDED</option><option>FAILED</option><option>STOPPED</option></select></div>
<div class="scroll"><table id="jobs"><colgroup><col style="width:26px"><col style="width:26%"><col style="width:20%"><col style="width:88px"><col style="width:108px"><col style="width:40px"><col></colgroup>
<thead><tr><th title="compare with the selected job">±</th><th>job</th><th>name</th><th>kind</th><th>state</th><th>att.</th><th>reason</th></tr></thead><tbody></tbody></table></div></section>
</div>
<div style="min-width:0">
<section><h2 id="jobtitle">Job</h2><div id="state"></div><div id="reason"></div><div id="progress"></div>
<div class="controls"><label>smoothing <select id="smooth"><option value="0">none</option><option value="0.6">0.6</option>
<option value="0.9">0.9</option><option value="0.99">0.99</option></select></label>
<label><input type="checkbox" id="log"> log scale</label><span id="legend"></span></div>
<div id="charts"></div><div id="results"></div></section>
<section style="margin-top:12px"><h2>Logs <select id="rank"></select> <span id="attempt"></span></h2><pre id="logs"></pre></section>
</div>
</main>
<script>
"use strict";
const $ = id => document.getElementById(id);
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));
// JSON carries enum values by name (JOB_STATE_RUNNING); the page shows the state (RUNNING).
const st = s => String(s ?? "").replace(/^(JOB|NODE)_STATE_/, "");
const COLORS = ["#3b82f6", "#e4572e", "#17a398", "#8e44ad", "#f3a712", "#5c6b73"];

// The view in the fragment: job, compare, smooth, log (and a token, moved to sessionStorage).
const view = {job: null, compare: [], smooth: 0, log: false, hover: false};
(function readFragment() {
  const h = new URLSearchParams(location.hash.slice(1));
  if (h.get("token")) sessionStorage.setItem("tessera-token", h.get("token"));
  view.job = h.get("job") || null;
  view.compare = (h.get("compare") || "").split(",").filter(Boolean);
  view.smooth = Math.min(0.999, Math.max(0, +h.get("smooth") || 0));
  view.log = h.get("log") === "1";
  view.hover = h.get("hover") === "1";  // shows the value under a pointer at the charts' middle
  writeFragment();
})();
function writeFragment() {
  const h = new URLSearchParams();
  if (view.job) h.set("job", view.job);
  if (view.compare.length) h.set("compare", view.compare.join(","));
  if (view.smooth) h.set("smooth", view.smooth);
  if (view.log) h.set("log", "1");
  history.replaceState(null, "", location.pathname + (h.toString() ? "#" + h : ""));
}
let token = sessionStorage.getItem("tessera-token") || "";
let jobs = [], rankCount = 0, unreachableSince = null;
const runs = {};  // job id -> {lastSeq, series: {metric: [[step, value, attempt]]}, lastEvent}
async function api(path) {
  let r;
  try { r = await fetch("/api/" + path, {headers: {Authorization: "Bearer " + token}}); }
  catch (e) { throw Object.assign(new Error("cannot reach the controller"), {unreachable: true}); }
  if (r.status === 401) { showLogin("the token was refused"); throw new Error("401"); }
  if (r.status >= 500) throw Object.assign(new Error("the controller answered " + r.status), {unreachable: true});
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}
function showLogin(why) { $("main").style.display = "none"; $("login").style.display = "block"; $("loginerr").textContent = why || ""; }
$("go").onclick = () => { token = $("token").value.trim(); sessionStorage.setItem("tessera-token", token); start(); };
function selectJob(id) {
  if (id === view.job) return;
  view.job = id; view.compare = view.compare.filter(c => c !== id); writeFragment();
  $("charts").innerHTML = ""; $("results").innerHTML = ""; refresh();
}

// Every event of a job after what is loaded, a page at a time.
async function loadEvents(id) {
  const run = runs[id] = runs[id] || {lastSeq: 0, series: {}, lastEvent: null};
  for (let more = true; more;) {
    const ev = await api(`jobs/${encodeURIComponent(id)}/events?from=${run.lastSeq}`);
    for (const e of ev.events) {
      run.lastSeq = Math.max(run.lastSeq, +e.seq);
      const p = e.progress;
      if (p && p.metrics && Object.keys(p.metrics).length) {
        run.lastEvent = p;
        for (const [k, v] of Object.entries(p.metrics)) (run.series[k] = run.series[k] || []).push([+p.step, +v, +e.attempt || 1]);
      }
    }
    more = ev.more && ev.events.length > 0;
  }
  return run;
}

// Axes: about n "nice" ticks (1, 2 or 5 times a power of ten) over [lo, hi].
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / n, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
  const step = (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p, out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
  return out;
}
const fmt = v => {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
  return (+v.toPrecision(4)).toString();
};
// A tick's label with as many digits as the ticks' step needs to tell them apart.
const tickFmt = (v, step) => {
  const a = Math.abs(v), digits = Math.max(0, Math.ceil(-Math.log10(step) + 1e-9));
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(Math.max(1, Math.min(8, Math.ceil(Math.log10(a / step) + 1e-9))));
  return v.toFixed(Math.min(8, digits));
};
// TensorBoard's smoothing: an exponential moving average, debiased at the start; each
// attempt smoothed on its own.
function smooth(pts, w) {
  if (!w) return pts;
  let last = 0, n = 0, att = null;
  return pts.map(([x, y, a]) => {
    if (a !== att) last = 0, n = 0, att = a;
    last = last * w + (1 - w) * y; n++;
    return [x, last / (1 - Math.pow(w, n)), a];
  });
}
const charts = {};  // metric -> what the pointer reads: per run, its points in screen x
function chart(name, lines) {
  const W = 360, H = 190, L = 54, R = 10, T = 10, B = 24;
  const all = lines.flatMap(l => l.shown.concat(l.raw));
  const xs = all.map(p => p[0]);
  let ys = all.map(p => p[1]);
  const logOk = view.log && ys.every(y => y > 0);
  const fy = logOk ? Math.log10 : (y => y);
  ys = ys.map(fy);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x0 -= 1, x1 += 1;
  // A flat curve (the range a rounding's width): a band of 1% around it, not axis labels
  // of ten digits.
  if (y1 - y0 <= 1e-4 * Math.max(Math.abs(y0), Math.abs(y1))) { const m = (y0 + y1) / 2, d = Math.abs(m) * 0.005 || 1; y0 = m - d; y1 = m + d; }
  const pad = (y1 - y0) * 0.04; y0 -= pad; y1 += pad;
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => T + (y1 - fy(y)) / (y1 - y0) * (H - T - B);
  const syl = v => T + (y1 - v) / (y1 - y0) * (H - T - B);
  let g = "";
  const yt = logOk ? niceTicks(y0, y1, 4).filter(t => Math.abs(t - Math.round(t)) < 1e-9 || y1 - y0 < 2) : niceTicks(y0, y1, 4);
  const ystep = yt.length > 1 ? yt[1] - yt[0] : Math.abs(yt[0]) || 1;
  for (const t of yt) {
    const y = syl(t).toFixed(1);
    g += `<line class="grid" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/><text class="tick" x="${L - 4}" y="${+y + 3}" text-anchor="end">${logOk ? fmt(Math.pow(10, t)) : tickFmt(t, ystep)}</text>`;
  }
  for (const t of niceTicks(x0, x1, 5).filter(t => Number.isInteger(t))) {
    const x = sx(t).toFixed(1);
    g += `<line class="grid" x1="${x}" x2="${x}" y1="${T}" y2="${H - B}"/><text class="tick" x="${x}" y="${H - B + 12}" text-anchor="middle">${t}</text>`;
  }
  g += `<line class="axis" x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}"/><line class="axis" x1="${L}" y1="${T}" x2="${L}" y2="${H - B}"/>`;
  g += `<text x="${W - R}" y="${H - 2}" text-anchor="end">step</text>`;
  const poly = (pts, cls, color) => {  // one line per attempt
    let out = "", seg = [], att = null;
    const flush = () => { if (seg.length) out += `<polyline class="${cls}" data-attempt="${att}" stroke="${color}" points="${seg.join(" ")}"/>`; seg = []; };
    for (const [x, y, a] of pts) { if (a !== att) flush(), att = a; seg.push(sx(x).toFixed(1) + "," + sy(y).toFixed(1)); }
    flush();
    return out;
  };
  for (const l of lines) {
    if (view.smooth) g += poly(l.raw, "raw", l.color);
    g += poly(l.shown, "line", l.color);
    if (l.primary)  // where each later attempt starts
      for (let i = 1; i < l.raw.length; i++)
        if (l.raw[i][2] !== l.raw[i - 1][2]) {
          const x = sx(l.raw[i][0]).toFixed(1);
          g += `<line class="attempt-mark" x1="${x}" x2="${x}" y1="${T}" y2="${H - B}"/><text class="attempt-label" x="${+x + 3}" y="${T + 9}">attempt ${l.raw[i][2]}</text>`;
        }
  }
  const cur = lines[0].shown[lines[0].shown.length - 1];
  charts[name] = {lines: lines.map(l => ({id: l.id, color: l.color, pts: l.shown.map(p => [sx(p[0]), p[0], p[1], p[2]])})), L, R, W};
  return `<div class="chart" data-metric="${esc(name)}" data-scale="${logOk ? "log" : "linear"}"><b>${esc(name)}</b><span class="now">${fmt(cur[1])} @ step ${cur[0]}</span>` +
    (view.log && !logOk ? ` <span class="now">(values ≤ 0: linear)</span>` : "") +
    `<svg class="curve" viewBox="0 0 ${W} ${H}" preserveAspectRatio="xMidYMid meet">${g}<line class="cursor" x1="0" x2="0" y1="${T}" y2="${H - B}" style="display:none"/>` +
    `<rect class="hit" x="${L}" y="${T}" width="${W - L - R}" height="${H - T - B}" fill="transparent"/></svg><div class="tip"></div></div>`;
}
// The value under the pointer: the nearest step of each line shown.
function hover(div, clientX) {
  const c = charts[div.dataset.metric], svg = div.querySelector("svg"), box = svg.getBoundingClientRect();
  if (!c || !box.width) return;
  const x = (clientX - box.left) / box.width * c.W, tip = div.querySelector(".tip"), cursor = svg.querySelector(".cursor");
  const rows = [];
  for (const l of c.lines) {
    let best = null;
    for (const p of l.pts) if (!best || Math.abs(p[0] - x) < Math.abs(best[0] - x)) best = p;
    if (best) rows.push(`<span style="color:${l.color}">■</span> step ${best[1]}: ${fmt(best[2])}` + (c.lines.length > 1 ? ` · ${esc(l.id)}` : "") + (best[3] > 1 ? ` (attempt ${best[3]})` : ""));
  }
  cursor.setAttribute("x1", x); cursor.setAttribute("x2", x); cursor.style.display = "";
  tip.innerHTML = rows.join("<br>"); tip.style.display = "block";
  tip.style.left = Math.max(4, Math.min(div.clientWidth - tip.offsetWidth - 4, clientX - div.getBoundingClientRect().left + 10)) + "px";
  tip.style.top = "24px";
}
function wireCharts() {
  for (const div of document.querySelectorAll(".chart")) {
    const hit = div.querySelector(".hit");
    hit.onmousemove = e => hover(div, e.clientX);
    hit.onmouseleave = () => { div.querySelector(".tip").style.display = "none"; div.querySelector(".cursor").style.display = "none"; };
    if (view.hover) { const b = div.querySelector("svg").getBoundingClientRect(); hover(div, b.left + b.width * 0.6); }
  }
}
const bytes = n => n >= 1 << 30 ? (n / (1 << 30)).toFixed(1) + " GiB" : n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MiB" : n >= 1024 ? (n / 1024).toFixed(0) + " KiB" : n + " B";
function results(job) {
  let r = null;
  try { r = job.resultJson ? JSON.parse(job.resultJson) : null; } catch (e) { r = null; }
  if (!r || !Array.isArray(r.comm_check)) return "";
  return `<h2 style="margin-top:12px">Comm-check results</h2><div class="scroll"><table><thead><tr><th>group</th><th>kind</th><th>collective</th><th>size</th><th>groups × ranks</th>` +
    `<th>time µs</th><th>algbw GB/s</th><th>busbw GB/s</th></tr></thead><tbody>` +
    r.comm_check.map(x => `<tr><td>${esc(x.group)}</td><td>${esc(x.kind)}</td><td>${esc(x.collective)}</td><td>${bytes(+x.size)}</td><td>${x.groups} × ${x.group_size}</td>` +
      `<td>${(+x.time_us).toFixed(1)}</td><td>${(+x.algbw_gbps).toFixed(2)}</td><td>${(+x.busbw_gbps).toFixed(2)}</td></tr>`).join("") + `</tbody></table></div>`;
}
async function refreshJob(job) {
  const ids = [job.jobId].concat(view.compare.filter(c => c !== job.jobId && jobs.some(j => j.jobId === c)));
  for (const id of ids) await loadEvents(id);
  const full = await api(`jobs/${encodeURIComponent(job.jobId)}`);
  const run = runs[job.jobId];
  $("jobtitle").textContent = `Job ${job.jobId} · ${job.spec.name} · ${job.spec.kind}`;
  $("state").innerHTML = `<span class="st ${st(full.state)}">${st(full.state)}</span> · attempt ${full.attempt}` +
    (full.restarts ? ` · ${full.restarts} restart${full.restarts > 1 ? "s" : ""}` : "");
  $("reason").className = st(full.state); $("reason").textContent = full.reason || "";
  $("progress").textContent = run.lastEvent ? (run.lastEvent.message || `step ${run.lastEvent.step}`) : "";
  $("legend").innerHTML = ids.length > 1 ? ids.map((id, i) => { const j = jobs.find(x => x.jobId === id);
    return `<span class="run"><i style="background:${COLORS[i % COLORS.length]}"></i>${esc(id)} · ${esc(j ? j.spec.name : "")}</span>`; }).join("") : "";
  const names = Object.keys(run.series).sort().filter(k => run.series[k].length > 0);
  $("charts").innerHTML = names.map(k => chart(k, ids.map((id, i) => ({id, color: COLORS[i % COLORS.length], primary: i === 0,
    raw: (runs[id].series[k] || []), shown: smooth(runs[id].series[k] || [], view.smooth)})).filter(l => l.raw.length))).join("");
  wireCharts();
  $("results").innerHTML = results(full);
  const ranks = (full.assignments || []).length || (job.spec.groups || []).reduce((n, g) => n + (+g.devices || 0), 0);
  if (ranks !== rankCount) {
    rankCount = ranks;
    $("rank").innerHTML = Array.from({length: ranks}, (_, r) => `<option value="${r}">rank ${r}</option>`).join("");
  }
  const lg = await api(`jobs/${encodeURIComponent(job.jobId)}/logs?rank=${$("rank").value || 0}`);
  $("attempt").textContent = lg.attempt ? `attempt ${lg.attempt}` : "";
  const pre = $("logs"), atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = lg.lines.join("\n");
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}
function renderJobs() {
  const f = $("filter").value.trim().toLowerCase(), sf = $("statefilter").value;
  const shown = jobs.filter(j => (!f || j.jobId.toLowerCase().includes(f) || String(j.spec.name).toLowerCase().includes(f)) && (!sf || st(j.state) === sf));
  $("jobcount").textContent = `(${shown.length} of ${jobs.length})`;
  $("jobs").tBodies[0].innerHTML = shown.map(j => `<tr class="job ${j.jobId === view.job ? "sel" : ""}" data-id="${esc(j.jobId)}">` +
    `<td><input type="checkbox" class="cmp" title="compare" ${view.compare.includes(j.jobId) ? "checked" : ""} ${j.jobId === view.job ? "disabled" : ""}></td>` +
    `<td class="mono" title="${esc(j.jobId)}">${esc(j.jobId)}</td><td title="${esc(j.spec.name)}">${esc(j.spec.name)}</td><td>${esc(j.spec.kind)}</td>` +
    `<td class="st ${st(j.state)}">${st(j.state)}</td><td>${j.attempt}</td><td class="reason" title="${esc(j.reason)}">${esc(j.reason)}</td></tr>`).join("");
  for (const tr of $("jobs").tBodies[0].rows) {
    tr.onclick = e => { if (!e.target.classList.contains("cmp")) selectJob(tr.dataset.id); };
    tr.querySelector(".cmp").onchange = e => {
      const id = tr.dataset.id;
      view.compare = e.target.checked ? view.compare.concat([id]) : view.compare.filter(c => c !== id);
      writeFragment(); refresh();
    };
  }
}
function banner(on, why) {
  if (on && unreachableSince === null) unreachableSince = new Date();
  if (!on) unreachableSince = null;
  $("banner").style.display = on ? "block" : "none";
  $("banner").textContent = on ? `${why} (since ${unreachableSince.toLocaleTimeString()}); retrying every 2 s — what is shown is from before` : "";
  document.body.dataset.unreachable = on ? "1" : "0";
}
async function refresh() {
  try {
    const [cl, js] = await Promise.all([api("cluster"), api("jobs")]);
    banner(false);
    $("version").textContent = cl.controllerVersion;
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    $("nodes").tBodies[0].innerHTML = (cl.nodes || []).map(n => `<tr><td title="${esc(n.nodeId)}">${esc(n.nodeId)}</td><td class="st ${st(n.state)}">${st(n.state)}</td><td style="white-space:normal">` +
      (n.devices || []).map(d => `<span class="dev ${d.usedByJob ? "used" : ""}" title="${esc(d.type)} ${d.index} ${esc(d.name)}${d.usedByJob ? " · " + esc(d.usedByJob) : ""}"></span>`).join("") + `</td></tr>`).join("");
    jobs = js.jobs || [];
    if (!view.job && jobs.length) { view.job = (jobs.find(j => st(j.state) === "RUNNING") || jobs[0]).jobId; writeFragment(); }
    renderJobs();
    const job = jobs.find(j => j.jobId === view.job);
    if (job) await refreshJob(job);
    document.body.dataset.ready = "1";
  } catch (e) {
    if (e.unreachable) banner(true, e.message);
    else if (e.message !== "401") $("updated").textContent = "error: " + e.message;
  }
  document.body.dataset.overflow = document.documentElement.scrollWidth > window.innerWidth + 1 ? "1" : "0";
}
$("rank").onchange = refresh;
$("filter").oninput = renderJobs;
$("statefilter").onchange = renderJobs;
$("smooth").value = String(view.smooth); if ($("smooth").value !== String(view.smooth)) $("smooth").value = "0";
$("log").checked = view.log;
$("smooth").onchange = () => { view.smooth = +$("smooth").value; writeFragment(); refresh(); };
$("log").onchange = () => { view.log = $("log").checked; writeFragment(); refresh(); };
let timer = null;
function start() {
  if (!token) { showLogin(""); return; }
  $("login").style.display = "none"; $("main").style.display = "grid";
  refresh(); if (!timer) timer = setInterval(refresh, 2000);
}
start();
</script></body></html>
)PAGE";

}  // namespace tessera::controller

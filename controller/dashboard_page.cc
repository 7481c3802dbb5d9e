// The dashboard's page (controller/dashboard.h): plain HTML, CSS and JavaScript, inline,
// nothing fetched from elsewhere. Curves are drawn as SVG from the jobs' progress events.
#include "controller/dashboard.h"

namespace tessera::controller {

const char kDashboardPage[] = R"PAGE(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tessera</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:baseline}
header h1{font-size:16px;margin:0}header span{color:#aab}
main{display:grid;grid-template-columns:minmax(360px,1fr) 2fr;gap:12px;padding:12px}
section{background:#fff;border:1px solid #dde;border-radius:6px;padding:8px 12px;overflow:auto}
h2{font-size:13px;margin:4px 0 8px;text-transform:uppercase;color:#667;letter-spacing:.04em}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:3px 6px;border-bottom:1px solid #eef}
tr.job{cursor:pointer}tr.job:hover{background:#f0f3ff}tr.sel{background:#e3e9ff}
.st{font-weight:600}.RUNNING{color:#1a7f37}.SUCCEEDED{color:#0b5cad}.FAILED{color:#c62828}
.PENDING,.PLACING,.STARTING,.RESTARTING{color:#b26a00}.STOPPED{color:#666}.READY{color:#1a7f37}.LOST{color:#c62828}
.reason{color:#667;max-width:420px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.dev{display:inline-block;width:10px;height:10px;margin:1px;border-radius:2px;background:#cfd6e4}.dev.used{background:#3b82f6}
#charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:8px}
.chart{border:1px solid #eef;border-radius:4px;padding:4px}.chart b{font-size:12px}
svg.curve polyline{fill:none;stroke:#3b82f6;stroke-width:1.6}svg.curve text{font-size:10px;fill:#667}
svg.curve line{stroke:#ccd}
pre{background:#11151c;color:#d7dce5;padding:8px;max-height:260px;overflow:auto;font-size:11px;margin:0}
#login{display:none;padding:24px}#login input{width:360px}
</style></head><body>
<header><h1>Tessera</h1><span id="version"></span><span id="updated"></span></header>
<div id="login"><p>This dashboard reads through the controller's API: paste a token (any role).</p>
<input id="token" type="password" placeholder="token"> <button id="go">Open</button> <span id="loginerr"></span></div>
<main id="main" style="display:none">
<div>
<section><h2>Nodes</h2><table id="nodes"><thead><tr><th>node</th><th>state</th><th>devices</th></tr></thead><tbody></tbody></table></section>
<section style="margin-top:12px"><h2>Jobs</h2><table id="jobs"><thead><tr><th>job</th><th>name</th><th>kind</th><th>state</th><th>attempt</th><th>reason</th></tr></thead><tbody></tbody></table></section>
</div>
<div>
<section><h2 id="jobtitle">Job</h2><div id="progress"></div><div id="charts"></div></section>
<section style="margin-top:12px"><h2>Logs <select id="rank"></select> <span id="attempt"></span></h2><pre id="logs"></pre></section>
</div>
</main>
<script>
"use strict";
const $ = id => document.getElementById(id);
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));
// JSON carries enum values by name (JOB_STATE_RUNNING); the page shows the state (RUNNING).
const st = s => String(s ?? "").replace(/^(JOB|NODE)_STATE_/, "");
if (location.hash.startsWith("#token=")) {
  sessionStorage.setItem("tessera-token", decodeURIComponent(location.hash.slice(7)));
  history.replaceState(null, "", location.pathname);
}
let token = sessionStorage.getItem("tessera-token") || "";
let selected = null, series = {}, lastSeq = 0, lastEvent = null, rankCount = 0;
async function api(path) {
  const r = await fetch("/api/" + path, {headers: {Authorization: "Bearer " + token}});
  if (r.status === 401) { showLogin("the token was refused"); throw new Error("401"); }
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}
function showLogin(why) { $("main").style.display = "none"; $("login").style.display = "block"; $("loginerr").textContent = why || ""; }
$("go").onclick = () => { token = $("token").value.trim(); sessionStorage.setItem("tessera-token", token); start(); };
function selectJob(id) { if (id === selected) return; selected = id; series = {}; lastSeq = 0; lastEvent = null; $("charts").innerHTML = ""; refresh(); }
function chart(name, pts) {
  const W = 300, H = 120, L = 44, B = 18, xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = x => L + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - L - 6);
  const sy = y => 6 + (y1 > y0 ? (y1 - y) / (y1 - y0) : 0.5) * (H - B - 12);
  const fmt = v => Math.abs(v) >= 1000 || (Math.abs(v) < 0.01 && v !== 0) ? v.toExponential(2) : (+v.toFixed(4)).toString();
  const line = pts.map(p => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" ");
  return `<div class="chart" data-metric="${esc(name)}"><b>${esc(name)}</b> <span>${fmt(ys[ys.length - 1])} @ step ${xs[xs.length - 1]}</span>
<svg class="curve" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}"><line x1="${L}" y1="${H - B}" x2="${W}" y2="${H - B}"/><line x1="${L}" y1="0" x2="${L}" y2="${H - B}"/>
<text x="2" y="12">${fmt(y1)}</text><text x="2" y="${H - B}">${fmt(y0)}</text><text x="${L}" y="${H - 4}">${x0}</text><text x="${W - 30}" y="${H - 4}">${x1}</text>
<polyline points="${line}"/></svg></div>`;
}
async function refreshJob(job) {
  for (let more = true; more;) {  // the job's whole history, a page at a time
    const ev = await api(`jobs/${encodeURIComponent(job.jobId)}/events?from=${lastSeq}`);
    for (const e of ev.events) {
      lastSeq = Math.max(lastSeq, +e.seq);
      const p = e.progress;
      if (p && p.metrics && Object.keys(p.metrics).length) {
        lastEvent = p;
        for (const [k, v] of Object.entries(p.metrics)) (series[k] = series[k] || []).push([+p.step, +v]);
      }
    }
    more = ev.more && ev.events.length > 0;
  }
  $("jobtitle").textContent = `Job ${job.jobId} · ${job.spec.name} · ${job.spec.kind}`;
  $("progress").innerHTML = `<span class="st ${st(job.state)}">${st(job.state)}</span> ` +
    (lastEvent ? esc(lastEvent.message || `step ${lastEvent.step}`) : esc(job.reason));
  $("charts").innerHTML = Object.keys(series).sort().filter(k => series[k].length > 0).map(k => chart(k, series[k])).join("");
  const ranks = (job.assignments || []).length || (job.spec.groups || []).reduce((n, g) => n + (+g.devices || 0), 0);
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
async function refresh() {
  try {
    const [cl, js] = await Promise.all([api("cluster"), api("jobs")]);
    $("version").textContent = cl.controllerVersion;
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    $("nodes").tBodies[0].innerHTML = (cl.nodes || []).map(n => `<tr><td>${esc(n.nodeId)}</td><td class="st ${st(n.state)}">${st(n.state)}</td><td>` +
      (n.devices || []).map(d => `<span class="dev ${d.usedByJob ? "used" : ""}" title="${esc(d.type)} ${d.index} ${esc(d.name)}${d.usedByJob ? " · " + esc(d.usedByJob) : ""}"></span>`).join("") + `</td></tr>`).join("");
    const jobs = js.jobs || [];
    if (!selected && jobs.length) selected = (jobs.find(j => st(j.state) === "RUNNING") || jobs[jobs.length - 1]).jobId;
    $("jobs").tBodies[0].innerHTML = jobs.map(j => `<tr class="job ${j.jobId === selected ? "sel" : ""}" data-id="${esc(j.jobId)}"><td>${esc(j.jobId)}</td><td>${esc(j.spec.name)}</td><td>${esc(j.spec.kind)}</td>` +
      `<td class="st ${st(j.state)}">${st(j.state)}</td><td>${j.attempt}</td><td class="reason" title="${esc(j.reason)}">${esc(j.reason)}</td></tr>`).join("");
    for (const tr of $("jobs").tBodies[0].rows) tr.onclick = () => selectJob(tr.dataset.id);
    const job = jobs.find(j => j.jobId === selected);
    if (job) await refreshJob(job);
    document.body.dataset.ready = "1";
  } catch (e) { if (e.message !== "401") $("updated").textContent = "error: " + e.message; }
}
$("rank").onchange = refresh;
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

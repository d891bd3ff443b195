// agent-saga time-travel debugger. Plain ES2020, no dependencies, no build step.
// Every value from the log is rendered with textContent (never as HTML).
"use strict";
import { undoButton } from "/static/undo.js";
import { loadLimits, renderHalts, renderLimits } from "/static/governance.js";
import { renderApprovals } from "/static/approvals.js";
import { renderCheckpoint, verifyBadge } from "/static/verify.js";

// The saga statuses of docs/concepts.md ("States"); the server lists them in meta.statuses.
const LABEL = {
  running: "running", rolling_back: "rolling back", recovering: "recovering", orphaned: "orphaned",
  in_doubt: "in doubt", escalated: "escalated", resolved: "resolved by a person", rolled_back: "rolled back",
  committed: "committed", undoing: "undoing", undone: "undone",
};
// A saga's history (docs/concepts.md): who did what, and when.
const HISTORY = {
  started: "started", claimed: "taken over", escalated: "escalated", ended: "ended",
  retry_requested: "retry requested", compensated: "compensated",
  compensation_failed: "compensation failed", resolved: "resolved",
  undo_requested: "undo requested", undone: "undone", undo_gated: "undo gated",
  deferred: "deferred", deferred_done: "deferred call run",
  compensation_verified: "compensation verified",
};
// What a step's compensation proved (docs/undo.md, "Verified undo").
const VERIFIED = {
  verified: "compensated (verified)", unchecked: "compensated (unverified: nothing read back)",
  unverified: "in doubt: it did not read back as undone", pending: "in doubt: accepted, not final yet",
};
const POLL_MS = 1000;
const S = {
  meta: null, list: null, status: "", q: "", extra: [], cursor: null,
  view: "runs", saga: null, detail: null, at: null, step: null,
  esc: null, apr: null, generation: -1, lastList: 0, stale: false, busy: false,
};
const $ = (id) => document.getElementById(id);

// ---- DOM helpers ------------------------------------------------------------------
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = String(v);
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}
function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }
function fmtTs(ts) {
  if (ts === null || ts === undefined) return "–";
  const d = new Date(ts * 1000);
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}
function fmtTime(ts) { return ts === null || ts === undefined ? "–" : fmtTs(ts).slice(11); }
function fmtDur(s) {
  if (s === null || s === undefined) return "";
  if (s < 0.001) return `${Math.round(s * 1e6)} µs`;
  if (s < 1) return `${(s * 1000).toFixed(1)} ms`;
  if (s < 120) return `${s.toFixed(2)} s`;
  return `${Math.round(s / 60)} min`;
}
function ago(ts) {
  if (!ts || !S.meta) return "";
  const s = Math.max(0, S.meta.now - ts);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}
// Every count the page prints goes through here: "1 step", "2 steps".
const PLURAL = { retry: "retries", leaf: "leaves" };
function count(n, noun) { return `${n} ${n === 1 ? noun : PLURAL[noun] || noun + "s"}`; }
function short(id) { return typeof id === "string" && id.length > 12 ? id.slice(0, 12) + "…" : String(id); }
function json(v) { return JSON.stringify(v, null, 2); }
function badge(status) { return h("span", { class: `badge s-${status}`, text: LABEL[status] || status }); }
function pill(outcome, text) { return h("span", { class: `pill o-${outcome}`, text: text || outcome }); }
function toast(text, bad) {
  const t = $("toast");
  t.textContent = text;
  t.className = bad ? "bad" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
}
function banner(text, info) {
  const b = $("banner");
  if (!text) { b.hidden = true; return; }
  b.textContent = text;
  b.className = info ? "info" : "";
  b.hidden = false;
}

// Credential references ({"$credential_ref": name}) anywhere in a value.
function refsIn(v, out = []) {
  if (v && typeof v === "object") {
    if (!Array.isArray(v) && Object.keys(v).length === 1 && typeof v.$credential_ref === "string") {
      out.push(v.$credential_ref);
    } else {
      for (const x of Object.values(v)) refsIn(x, out);
    }
  }
  return out;
}
function valueBlock(v) {
  const refs = refsIn(v);
  return h("div", null,
    h("pre", { text: v === null || v === undefined ? "–" : json(v) }),
    refs.length ? h("div", null, ...refs.map((r) => h("span", { class: "ref", title: "a credential reference: the secret itself is never logged", text: `credential ref: ${r}` }))) : null);
}

// ---- API --------------------------------------------------------------------------
async function api(path, opts = {}) {
  const init = { credentials: "same-origin", headers: { Accept: "application/json" }, ...opts };
  if (opts.body !== undefined) {
    init.method = "POST";
    init.headers = { ...init.headers, "Content-Type": "application/json", "X-CSRF-Token": S.meta ? S.meta.csrf : "" };
    init.body = JSON.stringify(opts.body);
  }
  const r = await fetch(path, init);
  if (r.status === 401) { location.href = "/login"; throw new Error("sign in needed"); }
  let doc = null;
  try { doc = await r.json(); } catch (e) { doc = null; }
  if (!r.ok) { const err = new Error((doc && doc.error) || `HTTP ${r.status}`); err.doc = doc; throw err; }
  return doc;
}

// ---- routing ----------------------------------------------------------------------
function parseHash() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map((p) => { try { return decodeURIComponent(p); } catch (e) { return p; } });
  if (parts[0] === "escalations") return { view: "escalations" };
  if (parts[0] === "approvals") return { view: "approvals" };
  if (parts[0] === "limits") return { view: "limits" };
  if (parts[0] === "saga" && parts[1]) {
    const step = parts[2] === "step" && /^\d+$/.test(parts[3] || "") ? Number(parts[3]) : null;
    return { view: "runs", saga: parts[1], step };
  }
  return { view: "runs", saga: null, step: null };
}
function sagaHash(id, step) {
  return `#/saga/${encodeURIComponent(id)}` + (step !== null && step !== undefined ? `/step/${step}` : "");
}
async function route() {
  const r = parseHash();
  S.view = r.view;
  for (const v of ["runs", "escalations", "approvals", "limits"]) $(`tab-${v}`).classList.toggle("active", v === S.view);
  if (r.view === "runs") {
    if (r.saga !== S.saga) {
      S.saga = r.saga; S.detail = null; S.at = null;
    }
    S.step = r.step;
    if (S.saga) await loadDetail(); else renderContent();
  } else {
    renderContent();
    await (S.view === "limits" ? loadLimits(UI).then(renderContent) : loadQueues());
  }
  renderRuns();
}

// ---- loading ----------------------------------------------------------------------
async function loadMeta() {
  S.meta = await api("/api/v1/meta");
  $("wal").textContent = S.meta.wal_path;
  $("walstats").textContent = `${count(S.meta.sagas, "saga")} · ${count(S.meta.records, "record")} · ${(S.meta.size / 1024).toFixed(1)} KiB`;
  const d = $("damage");
  d.hidden = S.meta.damage_count === 0;
  d.textContent = `⚠ ${count(S.meta.damage_count, "damaged region")}`;
  renderCheckpoint($("checkpoint"), S.meta.verification, fmtTs, count);
  renderHalts(S.meta.halts, UI);  // the red banner of a halted log, on every view
  if (S.meta.error) banner(`The log cannot be read: ${S.meta.error}`);
  else if (S.meta.loading) banner(`Reading the WAL… ${count(S.meta.records, "record")} so far`, true);
  else if (!S.stale) banner(null);
}
function listQuery(cursor) {
  const p = new URLSearchParams();
  if (S.status) p.set("status", S.status);
  if (S.q) p.set("q", S.q);
  if (cursor !== null && cursor !== undefined) p.set("cursor", String(cursor));
  p.set("limit", "100");
  return `/api/v1/sagas?${p}`;
}
async function loadList() {
  S.list = await api(listQuery(null));
  S.extra = [];
  S.cursor = S.list.next_cursor;
  S.lastList = Date.now();
  renderFilters();
  renderRuns();
}
async function loadMore() {
  if (S.cursor === null) return;
  const page = await api(listQuery(S.cursor));
  S.extra.push(...page.items);
  S.cursor = page.next_cursor;
  renderRuns();
}
async function loadDetail() {
  if (!S.saga) return;
  const id = S.saga;
  try {
    const d = await api(`/api/v1/sagas/${encodeURIComponent(id)}`);
    if (S.saga !== id) return;
    const atEnd = S.detail === null || S.at === null || S.at >= S.detail.records.length - 1;
    S.detail = d;
    if (atEnd) S.at = d.records.length - 1;  // following "now" keeps following it
    S.at = Math.min(S.at, d.records.length - 1);
    if (S.step !== null && !d.steps.some((s) => s.step === S.step)) S.step = null;
  } catch (e) {
    S.detail = { error: String(e.message || e) };
  }
  renderContent();
}
async function loadQueues() {
  const [esc, apr] = await Promise.all([api("/api/v1/escalations?all=1"), api("/api/v1/approvals?all=1")]);
  S.esc = esc; S.apr = apr;
  const ne = $("n-esc"), na = $("n-apr");
  ne.textContent = String(esc.open); ne.classList.toggle("hot", esc.open > 0);
  na.textContent = String(apr.open); na.classList.toggle("hot", apr.open > 0);
  if (S.view !== "runs") renderContent();
}
async function tick() {
  if (S.busy) return;
  S.busy = true;
  try {
    await loadMeta();
    const changed = S.meta.generation !== S.generation;
    S.generation = S.meta.generation;
    // Leases expire with time, not with records: refresh the list every few seconds too.
    if (changed || Date.now() - S.lastList > 4000) {
      await loadList();
      await loadQueues();
      if (changed && S.view === "runs" && S.saga) await loadDetail();
      if (S.view === "limits") { await loadLimits(UI); renderContent(); }
    }
    if (S.stale) { S.stale = false; banner(null); }
    $("live").classList.remove("stale");
  } catch (e) {
    S.stale = true;
    $("live").classList.add("stale");
    banner(`Lost contact with the server (${e.message || e}); retrying…`);
  } finally {
    S.busy = false;
  }
}

// ---- sidebar ----------------------------------------------------------------------
function renderFilters() {
  const f = clear($("filters"));
  const counts = S.list ? S.list.counts : {};
  const total = S.list ? S.list.total : 0;
  const chip = (value, label, n) => h("button", {
    type: "button", class: "chip" + (S.status === value ? " on" : ""), dataset: { status: value || "all" },
    onclick: () => { S.status = S.status === value ? "" : value; loadList(); },
  }, label, h("span", { class: "n", text: n }));
  f.append(chip("", "all", total));
  for (const st of (S.meta ? S.meta.statuses : [])) f.append(chip(st, LABEL[st] || st, counts[st] || 0));
}
function allRuns() { return S.list ? [...S.list.items, ...S.extra] : []; }
function renderRuns() {
  const ol = clear($("runs"));
  const state = $("runs-state");
  if (!S.list) { state.textContent = "Loading runs…"; return; }
  const items = allRuns();
  if (S.list.total === 0) {
    state.textContent = S.meta && S.meta.loading ? "Reading the WAL…" : "No sagas in this WAL yet. Runs appear here within a second of being logged.";
  } else if (items.length === 0) {
    state.textContent = "No run matches this filter.";
  } else {
    state.textContent = S.list.matched === S.list.total ? count(S.list.total, "run") : `${S.list.matched} of ${count(S.list.total, "run")}`;
  }
  for (const s of items) {
    const counts = Object.entries(s.steps).map(([k, n]) => `${n} ${k}`).join(", ");
    const sub = `${short(s.saga)} · ${count(s.step_count, "step")}${counts ? " (" + counts + ")" : ""} · ${ago(s.last_ts)}`;
    ol.append(h("li", {
      tabindex: "0", class: s.saga === S.saga ? "sel" : "", dataset: { saga: s.saga, status: s.status },
      onclick: () => { location.hash = sagaHash(s.saga, null); },
      onkeydown: (ev) => { if (ev.key === "Enter") location.hash = sagaHash(s.saga, null); },
    },
    h("span", { class: "name", text: s.name || "(unnamed)", title: s.name || "(unnamed)" }),
    badge(s.status),
    h("span", { class: "sub", text: sub, title: sub }),
    verifyBadge(s.verification, h, false)));
  }
  $("more").hidden = S.cursor === null || S.cursor === undefined;
}

// ---- time travel ------------------------------------------------------------------
// What the log said right after record `at`: every step's state (replaying the
// server's deltas), the steps whose forward call had committed, the saga's status,
// the outcome its saga_end recorded (if it had ended), and which escalations were
// open (a re-escalation reuses its id).
function pointAt(d, at) {
  const states = new Map(), committed = new Set(), escalationOpen = new Map();
  let status = "running", outcome = null;
  for (let i = 0; i <= at && i < d.records.length; i++) {
    const r = d.records[i];
    if (r.step !== null && r.step_state !== null) states.set(r.step, r.step_state);
    if (r.type === "committed" && r.step !== null) committed.add(r.step);
    if (r.type === "escalated") escalationOpen.set(r.data.escalation, true);
    if (r.type === "escalation_resolved") escalationOpen.set(r.data.escalation, false);
    if (r.type === "saga_end" && outcome === null) outcome = r.data.outcome;
    status = r.saga_status;
  }
  return { at, atEnd: at >= d.records.length - 1, states, committed, escalationOpen, status, outcome };
}
// The forward effect happened: the call committed, or something undid (or is undoing) it.
function happened(s, st, p) {
  return p.committed.has(s.step) || ["compensating", "compensated", "compensation_failed"].includes(st);
}
// Owed an undo at point p: the effect happened (or may have: intent, unknown), nothing
// undid it yet, something can (never an IRREVERSIBLE step), and the saga has not
// committed (its effects are then kept). An escalated step stays owed until a human
// resolves its escalation.
const NEVER_OWED = ["gated", "refused", "no_effect", "compensated"];
function owed(d, s, st, p) {
  if (s.semantics === "irreversible" || p.outcome === "committed" || NEVER_OWED.includes(st)) return false;
  if (st === "escalated") return p.escalationOpen.get(s.escalation) !== false;
  return true;
}
// Until the saga fails, what it owes is only undone if it does.
function owedTitle(d, p) {
  const running = p.status === "running" && !(p.atEnd && d.status === "orphaned");
  return running ? "Owed — undone if the saga fails" : "Owed — still to undo";
}
function outcomeOf(d, s, state, p) {
  const base = (S.meta && S.meta.outcome_of_state[state]) || "unknown";
  if (p.atEnd && d.status === "orphaned" && owed(d, s, state, p)) return "orphaned";
  return base;
}
// The colour of an undo run's outcome (see _timeline.py).
const RUN_OUTCOME = { compensated: "compensated", failed: "failed", escalated: "escalated", interrupted: "unknown" };
function runText(r) {
  const who = r.retry ? `retry requested by ${r.retry.by} at ${fmtTime(r.retry.ts)} (${r.retry.note}), run by ${r.by}` : `run by ${r.by}`;
  const failed = r.attempts ? ` · ${count(r.attempts, "failed attempt")}` : "";
  const error = r.error ? ` — ${r.error}` : "";
  const escalated = r.escalated && r.escalated !== r.error ? ` — escalated: ${r.escalated}` : "";
  return `${who}, ${fmtTime(r.start)} → ${fmtTime(r.end)}${failed}${error}${escalated}`;
}
function travel(to) {
  const d = S.detail;
  if (!d || !d.records || !d.records.length) return;
  S.at = Math.max(0, Math.min(d.records.length - 1, to));
  renderContent();
}

// ---- content ----------------------------------------------------------------------
function renderContent() {
  const c = clear($("content"));
  if (S.view === "escalations") return renderEscalations(c);
  if (S.view === "approvals") return renderApprovals(c, S.apr, UI, reloadQueues);
  if (S.view === "limits") return renderLimits(c, UI);
  if (!S.saga) {
    let text = "Select a run on the left (j / k), or open a deep link #/saga/<id>/step/<n>.";
    if (S.list && S.list.total === 0) text = "This WAL has no sagas yet. Run an agent with saga(wal_path=…) pointing at it: its steps appear here live.";
    if (!S.list) text = "Loading…";
    c.append(h("div", { class: "state muted", id: "content-state", text }));
    return;
  }
  const d = S.detail;
  if (!d) { c.append(h("div", { class: "state muted", text: "Loading saga…" })); return; }
  if (d.error) { c.append(h("div", { class: "state note warn", text: `Cannot show saga ${S.saga}: ${d.error}` })); return; }
  renderSaga(c, d);
}

function renderSaga(c, d) {
  const n = d.records.length;
  const at = S.at === null ? n - 1 : S.at;
  const p = pointAt(d, at);
  const now = atEndPoint(d, p);
  const atEnd = p.atEnd;
  const cur = d.records[at];
  c.append(h("div", { class: "saga-head" },
    h("h1", { id: "saga-name", text: d.name || "(unnamed saga)" }), badge(d.status),
    h("span", { class: "mono muted", id: "saga-id", text: d.saga }), undoButton(d, UI)));
  const vb = verifyBadge(d.verification, h, true);
  if (vb) { vb.id = "saga-verification"; c.append(h("div", { class: "verification" }, vb)); }
  const facts = h("div", { class: "facts" },
    h("span", null, "started ", h("b", { text: fmtTs(d.started) })),
    h("span", null, "duration ", h("b", { text: fmtDur(d.duration) || "–" })),
    h("span", null, "owner ", h("b", { class: "mono", text: d.owner ? short(d.owner) : "unknown (no saga_begin)" })),
    h("span", null, "records ", h("b", { text: n })),
    d.outcome ? h("span", null, "ended ", h("b", { text: `${d.outcome} by ${short(d.ended_by)}` })) : h("span", null, "ended ", h("b", { text: "not yet" })));
  c.append(facts);
  if (d.history.length) c.append(renderHistory(d));
  if (d.claims.length) {
    const cl = d.claims[d.claims.length - 1];
    c.append(h("div", { class: "note o-recovering" }, `Claimed by the recovery daemon ${cl.by} (fence ${cl.fence}) at ${fmtTime(cl.ts)}` + (d.outcome ? `; it ended the saga: ${d.outcome}.` : ".")));
  }
  const endRec = d.records.find((r) => r.type === "saga_end");
  if (endRec && endRec.data.note) c.append(h("div", { class: "note" }, String(endRec.data.note)));
  if (d.status === "orphaned") c.append(h("div", { class: "note warn" }, "Orphaned: the owner's lease expired and no saga_end was written. Run saga-recoveryd to finish the rollback."));
  for (const e of d.escalations.filter((x) => !x.resolved)) {
    const retry = e.retry && !e.retry.outcome ? ` Retry requested by ${e.retry.by}: ${e.retry.claimed_by ? "being carried out by " + e.retry.claimed_by : "waiting for saga-recoveryd"}.` : "";
    c.append(h("div", { class: "note o-escalated" }, `Escalated (${e.escalation}, step ${e.step ?? "–"}): ${e.reason}${retry} `, h("a", { href: "#/escalations", text: "→ escalation queue" })));
  }
  const retried = d.steps.filter((s) => s.undo_runs.some((r) => r.retry));
  if (retried.length) {
    const each = retried.map((s) => `step ${s.step} → ${s.undo_runs.filter((r) => r.retry).map((r) => r.outcome || "in progress").join(", ")}`);
    c.append(h("div", { class: "note o-recovering", id: "retries-note" }, `Retried by an operator (agent-saga escalations retry): ${each.join("; ")}.`));
  }
  for (const dm of d.damages) {
    c.append(h("div", { class: "note warn" }, `Damaged log region inside this saga's records: offset ${dm.offset}, ${dm.length} bytes (${dm.kind}: ${dm.detail}). Records may be missing here.`));
  }
  if (d.truncated) c.append(h("div", { class: "note warn", text: "This saga has more records than the page shows; the rest are in the log." }));

  // time travel bar
  const slider = h("input", { type: "range", id: "slider", min: 0, max: Math.max(0, n - 1), value: at, "aria-label": "time travel through the saga's records" });
  slider.addEventListener("input", () => travel(Number(slider.value)));
  c.append(h("div", { class: "travel" },
    h("button", { type: "button", id: "prev", title: "previous record (←)", onclick: () => travel(at - 1) }, "←"),
    slider,
    h("button", { type: "button", id: "next", title: "next record (→)", onclick: () => travel(at + 1) }, "→"),
    h("span", { id: "travel-label", text: cur ? `record ${at + 1}/${n} · ${cur.type}${cur.step !== null ? " · step " + cur.step : ""} · ${fmtTime(cur.ts)}${atEnd ? " · now" : ""}` : "no records" }),
    h("button", { type: "button", id: "now", title: "jump to now (End)", onclick: () => travel(n - 1), disabled: atEnd }, "now")));

  const grid = h("div", { class: "grid" });
  const left = h("div", null);
  const right = h("div", null);
  grid.append(left, right);
  c.append(grid);
  left.append(renderTimeline(d, p));
  left.append(renderLedger(d, p));
  left.append(renderRecords(d, at));
  right.append(renderInspector(d, p, now));
}
function atEndPoint(d, p) { return p.atEnd ? p : pointAt(d, d.records.length - 1); }

// The saga's history as the log tells it: "escalated by X at T: …; retry requested by
// Y …; compensated by saga-recoveryd Z …". The badge is its status now.
function renderHistory(d) {
  const ol = h("ol", { class: "history" });
  for (const e of d.history) {
    ol.append(h("li", { dataset: { event: e.event } },
      h("b", { text: HISTORY[e.event] || e.event }),
      ` by ${e.by ?? "unknown"} at ${fmtTime(e.ts)}${e.detail ? ": " + e.detail : ""}`));
  }
  return h("div", { class: "card", id: "history" }, h("h2", { text: "History" }), ol);
}

function renderTimeline(d, p) {
  const card = h("div", { class: "card", id: "timeline" }, h("h2", { text: "Timeline — forward steps in order, then compensations newest first (LIFO)" }));
  const recs = d.records;
  const t0 = recs.length ? recs[0].ts : 0;
  const t1 = recs.length ? recs[recs.length - 1].ts : 1;
  const span = Math.max(1e-6, (t1 || 0) - (t0 || 0));
  const curTs = recs[p.at] ? recs[p.at].ts : t1;
  const pos = (t) => `${Math.max(0, Math.min(100, ((t - t0) / span) * 100)).toFixed(2)}%`;
  const bar = (start, end, outcome, title) => {
    const el = h("div", { class: `tl-bar o-${outcome}`, title, dataset: { outcome } });
    const stop = end !== null && end !== undefined ? end : (p.atEnd ? t1 : curTs);
    el.style.left = `min(${pos(start)}, calc(100% - 3px))`;  // a bar at the very end stays inside
    el.style.width = `max(3px, calc(${pos(stop)} - ${pos(start)}))`;
    return el;
  };
  const row = (s, kind) => {
    const seen = p.states.has(s.step);
    const st = seen ? p.states.get(s.step) : null;
    let outcome = "future";
    let label = "not yet";
    const track = h("div", { class: "tl-track" });
    if (kind === "forward") {
      if (seen) { label = st; outcome = outcomeOf(d, s, st, p); }
      if (s.forward && s.forward.start !== null) track.append(bar(s.forward.start, s.forward.end, outcome, `${label} · ${fmtDur(s.forward.duration)}`));
    } else {
      // One bar per undo run (the rollback, then each retry), as far as the point shows.
      s.undo_runs.filter((r) => r.from_i <= p.at).forEach((r, k) => {
        const over = r.outcome !== null && r.to_i <= p.at;
        outcome = over ? RUN_OUTCOME[r.outcome] || "unknown" : "unknown";
        label = st;
        track.append(bar(r.start, over ? r.end : null, outcome, `run ${k + 1}: ${over ? r.outcome : "in progress"} — ${runText(r)}`));
      });
    }
    const cursor = h("div", { class: "tl-cursor" });
    cursor.style.left = `min(${pos(curTs)}, calc(100% - 1px))`;
    track.append(cursor);
    const name = `${kind === "undo" ? "↩ " : ""}#${s.step} ${s.tool || "?"}`;
    const part = kind === "undo" ? s.undo : s.forward;
    return h("div", {
      class: "tl-row" + (S.step === s.step ? " sel" : ""), dataset: { step: s.step, kind, outcome },
      tabindex: "0", onclick: () => selectStep(s.step),
    },
    h("span", { class: "tl-label" }, h("span", { class: "tl-name", title: name, text: name }), pill(outcome, label)),
    track,
    h("span", { class: "tl-dur", text: part ? fmtDur(part.duration) : "" }));
  };
  for (const n of d.forward_order) card.append(row(d.steps.find((s) => s.step === n), "forward"));
  if (d.undo_order.length) {
    // The server orders them newest first by the order the steps completed (LIFO),
    // whatever order the log holds them in (an operator may retry in any order).
    card.append(h("div", { class: "tl-sep", text: "compensations (newest first)" }));
    for (const n of d.undo_order) card.append(row(d.steps.find((s) => s.step === n), "undo"));
  }
  if (!d.steps.length) card.append(h("div", { class: "muted", text: "No steps were logged (REVERSIBLE steps live in memory only)." }));
  return card;
}

function renderLedger(d, p) {
  const done = [], due = [], undone = [], other = [];
  const item = (s, st, tag) => {
    const name = `#${s.step} ${s.tool || "?"}`;
    return h("li", { dataset: { step: s.step } }, pill(outcomeOf(d, s, st, p), st),
      h("span", { class: "name", title: name, text: name }),
      tag ? h("span", { class: "tag", text: tag }) : null);
  };
  for (const s of d.steps) {
    if (!p.states.has(s.step)) continue;
    const st = p.states.get(s.step);
    const did = happened(s, st, p);
    const irreversible = s.semantics === "irreversible" ? "irreversible · cannot be undone" : null;
    if (did) done.push(item(s, st, irreversible || (p.outcome === "committed" && st === "committed" ? "kept: the saga committed" : null)));
    if (st === "compensated") undone.push(item(s, st));
    else if (owed(d, s, st, p)) due.push(item(s, st));
    else if (!did) other.push(item(s, st, irreversible));
  }
  const col = (title, items, id) => h("div", { id }, h("h3", { text: `${title} (${items.length})` }), h("ul", null, items.length ? items : [h("li", { class: "muted", text: "–" })]));
  return h("div", { class: "card" }, h("h2", { text: "At this point" }),
    h("div", { class: "ledger" },
      col("Done — forward effect happened", done, "ledger-done"),
      col(owedTitle(d, p), due, "ledger-owed"),
      col("Undone — compensated", undone, "ledger-undone")),
    other.length ? h("div", { class: "section", id: "ledger-other" }, h("h3", { text: "Not done, or not known to be done (refused, no effect, outcome unknown, waiting)" }), h("ul", { class: "ledger" }, other)) : null);
}

function recordSummary(r) {
  const x = r.data || {};
  switch (r.type) {
    case "saga_begin": return `name=${x.name} owner=${short(x.owner)}`;
    case "intent": return `${x.tool} attempt ${x.attempt} ${JSON.stringify(x.kwargs)}`;
    case "committed": return x.handler ? `handler=${x.handler} ${JSON.stringify(x.kwargs)}` : "no compensation handler";
    case "forward_failed": return `${x.outcome}: ${x.error}`;
    case "gate": return `${x.decision} by ${x.decided_by}: ${x.reason}`;
    case "compensating": case "compensated": return `by ${short(x.by)} token ${short(x.token)}`;
    case "compensation_failed": return `attempt ${x.attempt}${x.final ? " final" : ""}: ${x.error}`;
    case "escalated": return `${x.escalation}: ${x.reason}`;
    case "escalation_resolved": return `${x.escalation} by ${x.by}: ${x.note}`;
    case "claim": return `by ${x.by} fence ${x.fence}${x.retry ? ` (retry of ${x.retry})` : ""}`;
    case "escalation_retry": return `${x.escalation} retry requested by ${x.by}: ${x.note}`;
    case "saga_end": return `${x.outcome} by ${short(x.by)}`;
    case "approval_requested": return `${x.request} ${x.tool} ${JSON.stringify(x.kwargs)}`;
    case "approval_decided": return `${x.request} ${x.decision} by ${x.by}: ${x.note}`;
    default: return JSON.stringify(x);
  }
}
function renderRecords(d, at) {
  const tbody = h("tbody");
  const t0 = d.records.length ? d.records[0].ts : 0;
  const cell = (text, title) => h("td", { text, title: title || String(text) });
  d.records.forEach((r, i) => {
    tbody.append(h("tr", { class: i === at ? "cur" : i > at ? "future" : "", dataset: { i }, onclick: () => travel(i) },
      cell(i + 1), cell(r.offset), cell(r.type), cell(r.step === null ? "" : r.step), cell(`+${fmtDur((r.ts || t0) - t0) || "0"}`),
      cell(recordSummary(r), json(r.data))));
  });
  // Fixed columns: a long detail is cut with "…" (the whole record is its title) and
  // never pushes the table under the inspector; a very narrow column scrolls instead.
  const cols = h("colgroup", null, ...["num", "offset", "type", "step", "t", "detail"].map((c) => h("col", { class: `c-${c}` })));
  return h("div", { class: "card" }, h("h2", { text: "Records (click to travel)" }),
    h("div", { class: "table-wrap" },
      h("table", { class: "records", id: "records" }, cols,
        h("thead", null, h("tr", null, ...["#", "offset", "type", "step", "t", "detail"].map((x) => h("th", { text: x })))), tbody)));
}

function selectStep(n) { location.hash = sagaHash(S.saga, n); }
function stepByOffset(delta) {
  const d = S.detail;
  if (!d || !d.steps.length) return;
  const nums = d.steps.map((s) => s.step);
  let i = S.step === null ? (delta > 0 ? -1 : nums.length) : nums.indexOf(S.step);
  i = Math.max(0, Math.min(nums.length - 1, i + delta));
  selectStep(nums[i]);
}
async function copyStep() {
  const d = S.detail;
  const s = d && d.steps ? d.steps.find((x) => x.step === S.step) : null;
  if (!s) return;
  const text = json(s);
  try { await navigator.clipboard.writeText(text); toast(`step ${s.step} copied as JSON`); } catch (e) {
    const ta = h("textarea", { text });
    document.body.append(ta); ta.select();
    try { document.execCommand("copy"); toast(`step ${s.step} copied as JSON`); } catch (e2) { toast("copy failed: select the JSON by hand", true); }
    ta.remove();
  }
}

function kv(...pairs) {
  const el = h("div", { class: "kv" });
  for (let i = 0; i < pairs.length; i += 2) el.append(h("div", { text: pairs[i] }), pairs[i + 1] instanceof Node ? pairs[i + 1] : h("div", { text: pairs[i + 1] ?? "–" }));
  return el;
}
function renderInspector(d, p, now) {
  const card = h("div", { class: "card", id: "inspector" });
  const s = d.steps.find((x) => x.step === S.step);
  if (!s) {
    card.append(h("h2", { text: "Inspector" }), h("div", { class: "muted", text: d.steps.length ? "Click a step in the timeline (or press ] ) to inspect it." : "Nothing to inspect." }));
    return card;
  }
  const st = p.states.has(s.step) ? p.states.get(s.step) : "not started yet";
  card.append(h("h2", null, `Step #${s.step} `, h("button", { type: "button", id: "copy-json", title: "copy this step as JSON (c)", onclick: copyStep }, "copy as JSON")));
  card.append(kv(
    "tool", h("div", { class: "mono", id: "insp-tool", text: s.tool || "?" }),
    "semantics", s.semantics,
    "state now", h("div", null, pill(outcomeOf(d, s, s.state, now), s.state)),
    "state at point", h("div", null, pill(p.states.has(s.step) ? outcomeOf(d, s, st, p) : "future", st)),
    "attempts", `${count(s.attempts, "attempt")} ${JSON.stringify(s.attempt_states)}`,
    "idempotency key", h("div", { class: "mono", text: s.idempotency_key || "–" }),
    "resolver", s.resolver,
    "forward", s.forward ? `${fmtTime(s.forward.start)} → ${fmtTime(s.forward.end)} (${fmtDur(s.forward.duration) || "unfinished"})` : "–"));
  card.append(h("div", { class: "section" }, h("h3", { text: "Forward kwargs (as logged)" }), valueBlock(s.kwargs)));
  if (s.error) card.append(h("div", { class: "section" }, h("h3", { text: "Last error recorded" }), h("pre", { id: "insp-error", text: String(s.error) })));
  const gate = h("div", { class: "section" }, h("h3", { text: "Gate & approval decisions" }));
  if (!s.gate.length && !s.approvals.length) gate.append(h("div", { class: "muted", text: "–" }));
  for (const g of s.gate) gate.append(h("div", null, pill(g.decision === "refused" ? "failed" : "committed", g.decision), ` by ${g.decided_by} at ${fmtTime(g.ts)} — ${g.reason}`));
  for (const a of s.approvals) gate.append(h("div", null, `approval ${a.request}: `, a.decision ? pill(a.decision === "approved" ? "committed" : "failed", a.decision) : pill("unknown", "waiting"), a.decision ? ` by ${a.by} at ${fmtTime(a.decided)} — ${a.note}` : ` (expires ${fmtTime(a.expires)})`));
  card.append(gate);
  const comp = h("div", { class: "section", id: "insp-compensation" }, h("h3", { text: "Compensation" }));
  comp.append(kv(
    "handler", h("div", { class: "mono", id: "insp-handler", text: s.handler || (s.semantics === "irreversible" ? "none (IRREVERSIBLE)" : "–") }),
    "token", h("div", { class: "mono", text: s.token || "–" }),
    "ran", s.undo ? `${fmtTime(s.undo.start)} → ${fmtTime(s.undo.end)} (${fmtDur(s.undo.duration) || "unfinished"}; ${count(s.undo_runs.length, "run")})` : "not run",
    "outcome", s.undo ? (s.undo.outcome || "in progress") : "–",
    "compensated by", s.compensated_by,
    "verification", h("div", { id: "insp-verification", dataset: { verification: s.verification || "" },
      text: s.verification ? `${VERIFIED[s.verification] || s.verification}${s.verify_reason ? " — " + s.verify_reason : ""}` : "–" })));
  if (s.receipt) comp.append(h("div", { class: "muted small", text: "receipt (what the compensation read back):" }), valueBlock(s.receipt));
  comp.append(h("div", { class: "muted small", text: "kwargs passed to the handler:" }), valueBlock(s.compensation_kwargs));
  if (s.undo_runs.length) {
    comp.append(h("div", { class: "muted small", text: "undo runs, oldest first (an operator's retry is a run of its own):" }),
      h("ol", { id: "insp-undo-runs" }, s.undo_runs.map((r) => h("li", { class: "small", dataset: { outcome: r.outcome || "running" } },
        pill(r.outcome ? RUN_OUTCOME[r.outcome] || "unknown" : "unknown", r.outcome || "in progress"), " ", runText(r)))));
  }
  if (s.undo_attempts.length) {
    comp.append(h("div", { class: "muted small", text: "undo records:" }),
      h("ul", { id: "insp-undo-attempts" }, s.undo_attempts.map((u) => h("li", { class: "mono small", text: `${fmtTime(u.ts)} ${u.type}${u.attempt ? " attempt " + u.attempt : ""}${u.final ? " (final)" : ""} by ${u.by}${u.error ? " — " + u.error : ""}` }))));
  }
  card.append(comp);
  if (s.escalation) {
    const e = d.escalations.find((x) => x.escalation === s.escalation);
    card.append(h("div", { class: "section" }, h("h3", { text: "Escalation" }),
      kv("id", s.escalation, "reason", e ? e.reason : "–", "state", e ? (e.resolved ? `resolved by ${e.resolved_by}: ${e.note}` : "open — see the escalation queue") : "–")));
  }
  if (s.preimage) card.append(h("div", { class: "section" }, h("h3", { text: "Pre-image (captured before the call)" }), valueBlock(s.preimage)));
  return card;
}

// ---- queues -----------------------------------------------------------------------
function whoInput(id) {
  const saved = localStorage.getItem("agent-saga-ui-by") || "";
  const el = h("input", { id, type: "text", maxlength: 100, placeholder: `your name (default: ${S.meta ? S.meta.user : "OS user"})`, value: saved, "aria-label": "who decides" });
  el.addEventListener("change", () => localStorage.setItem("agent-saga-ui-by", el.value.trim()));
  return el;
}
function renderEscalations(c) {
  c.append(h("h1", { text: "Escalation queue" }), h("p", { class: "muted", text: "Steps the library would not decide alone. Resolving one records escalation_resolved in the WAL, exactly as `agent-saga escalations resolve ID --note …` does." }));
  if (!S.esc) { c.append(h("div", { class: "state muted", text: "Loading…" })); return; }
  const open = S.esc.items.filter((e) => !e.resolved);
  const done = S.esc.items.filter((e) => e.resolved);
  if (!open.length) c.append(h("div", { class: "state muted", id: "esc-empty", text: "No open escalations. Nothing needs a human right now." }));
  for (const e of open) {
    const note = h("textarea", { placeholder: "what was done or decided (required; recorded in the log)", maxlength: 4000, "aria-label": "note" });
    const who = whoInput(`by-${e.escalation}`);
    const btn = h("button", { type: "button", class: "approve", dataset: { action: "resolve" } }, "Resolve");
    btn.addEventListener("click", async () => {
      btn.disabled = true;
      try {
        const r = await api(`/api/v1/escalations/${encodeURIComponent(e.escalation)}/resolve`, { body: { note: note.value, by: who.value.trim() || null } });
        toast(`Resolved ${r.resolved} — recorded in the WAL by ${r.by}`);
        await loadQueues(); S.generation = -1; await tick();
      } catch (err) { toast(String(err.message || err), true); btn.disabled = false; }
    });
    c.append(h("div", { class: "queue-item", dataset: { escalation: e.escalation } },
      h("h3", null, `${e.escalation} · `, h("a", { href: sagaHash(e.saga, e.step), text: `${e.saga_name || "saga"} ${short(e.saga)}` }), e.step !== null ? ` · step ${e.step}` : ""),
      h("div", { text: e.reason }),
      h("div", { class: "muted small", text: `raised by ${e.by} at ${fmtTs(e.ts)}` }),
      e.retry ? h("div", { class: "note o-recovering", text: `retry requested by ${e.retry.by} at ${fmtTs(e.retry.ts)}: ${e.retry.note}` + (e.retry.outcome ? ` — ${e.retry.outcome}` : e.retry.claimed_by ? ` — being carried out by ${e.retry.claimed_by}` : " — waiting for saga-recoveryd") }) : null,
      h("div", { class: "queue-form" }, note, who, btn)));
  }
  if (done.length) {
    c.append(h("h2", { class: "muted", text: "Resolved (sagas still live)" }));
    for (const e of done) c.append(h("div", { class: "queue-item resolved o-committed" }, h("h3", { text: `${e.escalation} · resolved by ${e.resolved_by}` }), h("div", { text: e.note }), h("div", { class: "muted small", text: e.reason })));
  }
}
// What undo.js ("Undo this run…"), governance.js and approvals.js use of this page.
const UI = { h, clear, api, whoInput, fmtTs, ago, pill, toast, valueBlock, sagaHash, short, refresh: () => { S.generation = -1; tick(); } };
async function reloadQueues() { await loadQueues(); S.generation = -1; await tick(); }

// ---- keyboard ---------------------------------------------------------------------
function onKey(ev) {
  const t = ev.target;
  const typing = t && (t.tagName === "INPUT" && t.type !== "range" || t.tagName === "TEXTAREA");
  if (ev.key === "Escape") { $("help").hidden = true; if (typing) t.blur(); return; }
  if (typing || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const d = S.detail;
  const runs = allRuns();
  const idx = runs.findIndex((s) => s.saga === S.saga);
  switch (ev.key) {
    case "ArrowLeft": if (S.view === "runs" && d && d.records) { travel((S.at ?? 0) - 1); ev.preventDefault(); } break;
    case "ArrowRight": if (S.view === "runs" && d && d.records) { travel((S.at ?? 0) + 1); ev.preventDefault(); } break;
    case "Home": if (d && d.records) { travel(0); ev.preventDefault(); } break;
    case "End": if (d && d.records) { travel(d.records.length - 1); ev.preventDefault(); } break;
    case "j": if (runs.length) location.hash = sagaHash(runs[Math.min(runs.length - 1, idx + 1)].saga, null); break;
    case "k": if (runs.length) location.hash = sagaHash(runs[Math.max(0, idx - 1)].saga, null); break;
    case "]": stepByOffset(1); break;
    case "[": stepByOffset(-1); break;
    case "c": copyStep(); break;
    case "/": $("search").focus(); ev.preventDefault(); break;
    case "1": location.hash = "#/"; break;
    case "2": location.hash = "#/escalations"; break;
    case "3": location.hash = "#/approvals"; break;
    case "4": location.hash = "#/limits"; break;
    case "?": $("help").hidden = !$("help").hidden; break;
    default: break;
  }
}

// ---- start ------------------------------------------------------------------------
async function start() {
  document.addEventListener("keydown", onKey);
  window.addEventListener("hashchange", () => { route().catch((e) => banner(String(e.message || e))); });
  $("help-btn").addEventListener("click", () => { $("help").hidden = !$("help").hidden; });
  $("more").addEventListener("click", () => loadMore());
  $("damage").addEventListener("click", () => {
    const box = $("damages");
    if (!box.hidden) { box.hidden = true; return; }
    clear(box).append(h("div", { text: "Damaged regions of the WAL (skipped; every valid record around them is shown):" }),
      h("ul", null, S.meta.damages.map((dm) => h("li", { text: `offset ${dm.offset}: ${dm.length} bytes, ${dm.kind} (${dm.detail})` }))));
    box.hidden = false;
  });
  let timer = null;
  $("search").addEventListener("input", (ev) => {
    clearTimeout(timer);
    timer = setTimeout(() => { S.q = ev.target.value.trim(); loadList(); }, 200);
  });
  try {
    await loadMeta();
    S.generation = S.meta.generation;
    await loadList();
    await loadQueues();
    await route();
  } catch (e) {
    banner(`Cannot reach the debugger's API: ${e.message || e}`);
  }
  setInterval(tick, POLL_MS);
}
start();

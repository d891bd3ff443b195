// The approval queue (docs/ui.md, docs/governance.md "Who approved what"): each
// request's whole story — quorum progress, every decision (who, when, break-glass,
// note, whether it counted and why not), the expiry, the step that used it — and the
// form that decides it through the same function as `agent-saga approvals approve|deny`.
// Imported by app.js, which passes its helpers in. Every value from the log is rendered
// with textContent (h's "text" and text nodes), never as HTML.

// What the operator typed, kept across re-renders (the queue is re-read every few s).
const drafts = new Map();

function draft(request) {
  if (!drafts.has(request)) drafts.set(request, { note: "", glass: false });
  return drafts.get(request);
}

const PILL = { open: "recovering", approved: "committed", denied: "failed", expired: "failed", saga_ended: "unknown" };

// state: the one-word state of the API item; a.story.state is the CLI's line.
function statePill(a, ui) {
  return ui.pill(PILL[a.state] || "unknown", a.state === "saga_ended" ? "saga ended" : a.state);
}

// "1 of 2 approvals (alice)", or how a settled request was settled.
function progressLine(a, ui) {
  const who = a.approvers.length ? ` (${a.approvers.join(", ")})` : "";
  const glass = a.break_glass ? " · settled by a break-glass approval" : "";
  return ui.h("div", { class: "apr-progress", dataset: { quorum: a.quorum, approvals: a.approvers.length } },
    ui.h("b", { text: a.progress }), `${who} · needs ${a.quorum} different ${a.quorum === 1 ? "person" : "people"}${glass}`);
}

// Every approval_decided of the request, in log order.
function decisionList(a, ui) {
  const ds = (a.story && a.story.decisions) || [];
  if (!ds.length) return ui.h("div", { class: "muted small apr-none", text: "no decision yet" });
  return ui.h("ol", { class: "apr-decisions" }, ...ds.map((d) => ui.h("li",
    { class: d.counted ? "counted" : "not-counted", dataset: { decision: d.decision, counted: d.counted ? "1" : "0", breakGlass: d.break_glass ? "1" : "0" } },
    ui.pill(d.decision === "approved" ? "committed" : "failed", d.decision),
    d.break_glass ? ui.h("span", { class: "pill o-escalated glass", text: "break-glass" }) : null,
    ` by ${d.by}`,
    d.identity && d.identity.how ? ui.h("span", { class: "muted", text: ` (${d.identity.how})` }) : null,
    ` at ${ui.fmtTs(d.ts)}`,
    ui.h("div", { class: "apr-note", text: d.note === null || d.note === undefined ? "" : String(d.note) }),
    d.counted ? null : ui.h("div", { class: "apr-why muted small", text: `not counted: ${d.why || "after the request was settled"}` }))));
}

// The attempts that ran under the request (intent.approval).
function usedBy(a, ui) {
  const used = (a.story && a.story.used_by) || [];
  if (!used.length) return null;
  return ui.h("div", { class: "apr-used small" }, "used by ",
    ...used.flatMap((u, i) => [i ? ", " : "", ui.h("a", { href: ui.sagaHash(u.saga, u.step), text: `step ${u.step}` }),
      ` (attempt ${u.attempt}) at ${ui.fmtTs(u.ts)}`]));
}

function meta(a, ui) {
  const agent = a.story && a.story.agent ? ` by ${a.story.agent.host} pid ${a.story.agent.pid}` : "";
  return ui.h("div", { class: "muted small apr-meta", text: `${a.request} · requested ${ui.fmtTs(a.ts)}${agent} · expires ${ui.fmtTs(a.expires)} · ${a.story ? a.story.state : a.state}` });
}

function form(a, ui, reload) {
  const d = draft(a.request);
  const note = ui.h("textarea", { placeholder: "why (required; recorded with the decision)", maxlength: 4000, "aria-label": "note" });
  note.value = d.note;
  note.addEventListener("input", () => { d.note = note.value; });
  const who = ui.whoInput(`by-${a.request}`);
  who.addEventListener("input", () => localStorage.setItem("agent-saga-ui-by", who.value.trim()));
  const glass = ui.h("input", { type: "checkbox", class: "apr-glass", "aria-label": "break-glass" });
  glass.checked = d.glass;
  glass.addEventListener("change", () => { d.glass = glass.checked; });
  const act = (decision) => async (ev) => {
    ev.target.disabled = true;
    try {
      const r = await ui.api(`/api/v1/approvals/${encodeURIComponent(a.request)}/decide`,
        { body: { decision, note: note.value, by: who.value.trim() || null, break_glass: glass.checked } });
      drafts.delete(a.request);
      ui.toast(`${r.message} — recorded in the WAL${r.decision ? "" : ` (${r.progress}; still waiting)`}`);
      await reload();
    } catch (err) { ui.toast(String(err.message || err), true); ev.target.disabled = false; }
  };
  return ui.h("div", { class: "queue-form" }, note, who,
    ui.h("label", { class: "small", title: "an emergency decision: one approval settles the request whatever its quorum; recorded break_glass and listed by `agent-saga approvals --break-glass`; a note is required" }, glass, " break-glass"),
    ui.h("button", { type: "button", class: "approve", dataset: { action: "approve" }, onclick: act("approve") }, "Approve"),
    ui.h("button", { type: "button", class: "deny", dataset: { action: "deny" }, onclick: act("deny") }, "Deny"));
}

function item(a, ui, reload) {
  const open = a.state === "open";
  return ui.h("div", { class: `queue-item ${open ? "o-recovering" : "resolved"} ${PILL[a.state] ? "o-" + PILL[a.state] : ""}`, dataset: { request: a.request, state: a.state } },
    ui.h("h3", null, statePill(a, ui), ` ${a.tool} (${a.semantics}) · `, ui.h("a", { href: ui.sagaHash(a.saga, a.step), text: `${a.saga_name || "saga"} ${ui.short(a.saga)}` }), ` · step ${a.step}`),
    ui.valueBlock(a.kwargs),
    meta(a, ui),
    progressLine(a, ui),
    decisionList(a, ui),
    usedBy(a, ui),
    open ? form(a, ui, reload) : null);
}

// The Approvals view. doc: GET /api/v1/approvals?all=1 (null while loading).
export function renderApprovals(c, doc, ui, reload) {
  const h = ui.h;
  c.append(h("h1", { text: "Approval queue" }), h("p", { class: "muted", text: "IRREVERSIBLE steps waiting for a human (ApprovalQueue). Approve or deny writes approval_decided in the WAL, exactly as `agent-saga approvals approve|deny ID --note …` does: a request of quorum N needs N different people; the same person deciding twice is refused; an expired request cannot be decided. Each request shows what `agent-saga approvals --json` prints." }));
  if (!doc) { c.append(h("div", { class: "state muted", text: "Loading…" })); return; }
  const open = doc.items.filter((a) => a.state === "open");
  const rest = doc.items.filter((a) => a.state !== "open");
  if (!open.length) c.append(h("div", { class: "state muted", id: "apr-empty", text: "No approval request is waiting." }));
  for (const a of open) c.append(item(a, ui, reload));
  if (rest.length) {
    c.append(h("h2", { class: "muted", text: "Decided or expired (sagas still live)" }));
    for (const a of rest) c.append(item(a, ui, reload));
  }
}

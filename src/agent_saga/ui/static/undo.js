// "Undo this run…" (docs/ui.md, docs/undo.md): the dry-run plan, a reason, a
// confirmation, then the outcome of each step. Imported by app.js, which passes its
// helpers in. Every value from the log is rendered with textContent (h's "text" and
// text nodes), never as HTML.

// The button on a committed saga's page (null for any other saga).
export function undoButton(d, ui) {
  if (d.outcome !== "committed" || d.status === "undoing") return null;
  return ui.h("button", { type: "button", id: "undo-btn", class: "undo", title: "compensate this committed run's steps, newest first (agent-saga undo)", onclick: () => openUndo(d.saga, ui) }, "Undo this run…");
}

const $ = (id) => document.getElementById(id);
let busy = false;

function close() {
  if (busy) return;
  $("undo").hidden = true;
}

function card(ui, title, ...kids) {
  const box = ui.clear($("undo"));
  box.hidden = false;
  const c = ui.h("div", { class: "undo-card" },
    ui.h("div", { class: "undo-head" }, ui.h("h2", { text: title }),
      ui.h("button", { type: "button", id: "undo-close", title: "close (Esc)", onclick: close }, "×")),
    ...kids);
  box.append(c);
  return c;
}

async function openUndo(saga, ui) {
  card(ui, "Undo this run", ui.h("div", { id: "undo-state", class: "muted", text: "Reading the plan (a dry run: nothing is written)…" }));
  let plan;
  try {
    plan = await ui.api(`/api/v1/sagas/${encodeURIComponent(saga)}/undo-plan`);
  } catch (e) {
    card(ui, "Undo this run", ui.h("div", { id: "undo-error", class: "note warn", text: `Cannot undo this run: ${e.message || e}` }));
    return;
  }
  showPlan(plan, ui, null);
}

function stepLine(ui, s, result) {
  const where = s.step === null ? "–" : String(s.step);
  const li = ui.h("li", { class: s.action === "cannot_undo" ? "cannot" : "will", dataset: { step: where, action: s.action } },
    ui.h("b", { text: `step ${where}` }), " · ", ui.h("span", { class: "mono", text: s.tool || "(not logged)" }), " — ");
  if (s.action === "cannot_undo") {
    li.append(ui.h("span", { class: "why", text: `cannot be undone: ${s.why}` }));
  } else {
    const verb = s.action === "compensate" ? "calls" : "asks its resolver, then calls";
    li.append(`${verb} `, ui.h("span", { class: "mono handler", text: s.handler }),
      ui.h("pre", { class: "kwargs", text: JSON.stringify(s.kwargs, null, 2) }),
      ui.h("div", { class: "muted small mono", text: `idempotency key (undo token): ${s.token}` }));
  }
  if (result !== undefined) li.append(ui.h("div", { class: `result r-${result.replace(/ .*/, "")}`, dataset: { result }, text: `→ ${result}` }));
  return li;
}

function showPlan(plan, ui, notice) {
  const h = ui.h;
  const what = plan.from_step === null ? "every step" : `step ${plan.from_step} and later`;
  const list = h("ol", { id: "undo-steps", class: "undo-steps" }, plan.steps.map((s) => stepLine(ui, s)));
  const reason = h("textarea", { id: "undo-reason", maxlength: 4000, placeholder: "why undo this run (required; recorded in the log with your name)", "aria-label": "reason" });
  const who = ui.whoInput("undo-by");
  const sure = h("input", { type: "checkbox", id: "undo-confirm" });
  const n = plan.will_compensate;
  const go = h("button", { type: "button", id: "undo-go", class: "deny", disabled: true }, n ? `Undo ${n === 1 ? "1 step" : n + " steps"} now` : "Record the undo (escalates every step)");
  const ready = () => { go.disabled = busy || !reason.value.trim() || !sure.checked; };
  reason.addEventListener("input", ready);
  sure.addEventListener("change", ready);
  go.addEventListener("click", () => run(plan, reason.value, who.value.trim() || null, ui));
  if (plan.tampered) sure.disabled = true;  // the server refuses it: no confirmation
  card(ui, "Undo this run",
    notice ? h("div", { id: "undo-notice", class: "note warn", text: notice }) : null,
    plan.gate ? h("div", { id: "undo-gate", class: "note", text: `Gate: ${plan.gate}` }) : null,
    plan.tampered ? h("div", { id: "undo-tampered", class: "note warn", text: `This run cannot be undone: the log fails verification where its records are (${plan.tampered}). Check the log with agent-saga wal verify.` }) : null,
    h("p", null, "Undo ", h("b", { text: plan.name || "(unnamed saga)" }), " ", h("span", { class: "mono muted", text: plan.saga }),
      `: ${what}, newest first, exactly once, as \u201cagent-saga undo\u201d does. The compensation handlers run in this server's process.`),
    list,
    plan.cannot_undo ? h("div", { class: "note o-escalated", text: `${plan.cannot_undo} of these cannot be undone: the undo escalates them (a person decides), and ends escalated.` }) : null,
    h("div", { class: "muted small mono", id: "undo-digest", text: `plan sha256 ${plan.plan}` }),
    h("div", { class: "queue-form" }, reason, who),
    h("label", { class: "confirm" }, sure, " I checked this plan: run these compensations now, against the real services."),
    h("div", { class: "undo-actions" }, go, h("button", { type: "button", id: "undo-cancel", onclick: close }, "Cancel")));
  reason.focus();
}

async function run(plan, reason, by, ui) {
  busy = true;
  const go = $("undo-go");
  if (go) { go.disabled = true; go.textContent = "Undoing…"; }
  let res;
  try {
    res = await ui.api(`/api/v1/sagas/${encodeURIComponent(plan.saga)}/undo`, { body: { reason, by, from_step: plan.from_step, plan: plan.plan } });
  } catch (e) {
    busy = false;
    if (e.doc && e.doc.plan) { showPlan(e.doc.plan, ui, e.message); return; }
    card(ui, "Undo this run", ui.h("div", { id: "undo-error", class: "note warn", text: `Nothing was undone: ${e.message || e}` }));
    return;
  } finally {
    busy = false;
  }
  showOutcome(res, ui);
  ui.refresh();
}

function showOutcome(res, ui) {
  const h = ui.h;
  const cls = res.outcome === "undone" ? "o-compensated" : "o-escalated";
  const title = res.outcome === "undone" ? "Undone" : res.outcome === "escalated" ? "Undo escalated" : "Undo handed over";
  card(ui, title,
    h("div", { id: "undo-outcome", class: `note ${cls}`, dataset: { outcome: res.outcome || "handed_over" }, text: res.message }),
    h("p", { class: "muted small", text: `${res.undo} · asked by ${res.by}: ${res.reason}` }),
    h("ol", { id: "undo-results", class: "undo-steps" }, res.steps.map((s) => stepLine(ui, s, s.step === null ? "not undone (no record)" : res.results[String(s.step)] || "not run"))),
    res.escalations.length ? h("div", { class: "note o-escalated" }, "Escalated (see the escalation queue): ",
      h("ul", null, res.escalations.map((e) => h("li", { text: `step ${e.step}: ${e.reason} (${e.escalation})` })))) : null,
    h("div", { class: "undo-actions" }, h("button", { type: "button", id: "undo-done", onclick: close }, "Close")));
}

document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && !$("undo").hidden) close();
});

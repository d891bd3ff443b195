// Governance (docs/ui.md, docs/governance.md): the red banner of a halted log, shown
// across every view, and the Limits view (budgets and rate limits, their use now).
// Imported by app.js, which passes its helpers in. Halt reasons, names and meter keys
// come from the log: every one is rendered with textContent (h's "text" and text
// nodes), never as HTML.

const $ = (id) => document.getElementById(id);
let limitsDoc = null;
let limitsError = null;

// ---- the halt banner ---------------------------------------------------------------
// halts: meta.halts (the halts in force, oldest first). Empty: the banner is hidden.
export function renderHalts(halts, ui) {
  const box = $("halts");
  if (!box) return;
  const list = Array.isArray(halts) ? halts : [];
  document.body.classList.toggle("halted", list.length > 0);
  if (!list.length) { ui.clear(box); box.hidden = true; delete box.dataset.ids; return; }
  const ids = list.map((x) => x.halt).join(" ");
  const since = (x) => `${ui.fmtTs(x.ts)} (${ui.ago(x.ts)})`;
  if (box.dataset.ids === ids && !box.hidden) {
    // The same halts: only "since" moves (re-rendering would drop a selection of the
    // resume command being copied).
    box.querySelectorAll(".halt-since").forEach((el, i) => { el.textContent = since(list[i]); });
    return;
  }
  ui.clear(box);
  box.dataset.ids = ids;
  box.hidden = false;
  const h = ui.h;
  box.append(h("div", { class: "halt-title" },
    h("b", { text: list.length === 1 ? "HALTED" : `HALTED (${list.length} halts in force)` }),
    " — gates on this log refuse new COMPENSABLE and IRREVERSIBLE steps in scope; REVERSIBLE steps keep running, saga-recoveryd keeps recovering."));
  const ul = h("ul", { class: "halt-list" });
  for (const x of list) {
    ul.append(h("li", { dataset: { halt: x.halt } },
      h("span", { class: "halt-scope", text: x.scope_words }),
      " · ", h("span", { class: "halt-reason", text: x.reason }),
      " · by ", h("b", { class: "halt-by", text: x.by }),
      " · since ", h("span", { class: "halt-since", text: since(x) }),
      x.unwind ? h("span", { class: "halt-unwind", text: " · --unwind: sagas in flight in scope are rolled back" }) : null,
      h("div", { class: "halt-resume" }, "To lift it: ", h("code", { class: "mono", text: x.resume }),
        h("span", { class: "muted", text: ` (halt ${x.halt})` }))));
  }
  box.append(ul);
}

// ---- the Limits view ---------------------------------------------------------------
export async function loadLimits(ui) {
  try {
    limitsDoc = await ui.api("/api/v1/limits");
    limitsError = null;
  } catch (e) {
    limitsError = String(e.message || e);
  }
}

function num(x) {
  if (typeof x !== "number") return "–";
  return Number.isInteger(x) ? String(x) : String(Math.round(x * 1e6) / 1e6);
}

function bar(ui, fill) {
  const pct = Math.max(0, Math.min(1, fill)) * 100;
  const level = fill >= 1 ? "full" : fill >= 0.8 ? "high" : "ok";
  const inner = ui.h("div", { class: "meter-fill" });
  inner.style.width = `${pct.toFixed(1)}%`;  // CSSOM: the CSP allows no style attribute
  return ui.h("div", { class: `meter-bar ${level}`, title: `${pct.toFixed(1)}% of the limit used or held` }, inner);
}

export function renderLimits(c, ui) {
  const h = ui.h;
  c.append(h("h1", { text: "Limits" }), h("p", { class: "muted", text: "Budgets and rate limits declared in this log (their latest definition) and, per key, what is used (committed) and held (in flight or with an unknown outcome) in the window that holds now — the numbers of `agent-saga limits`. Busiest meters first." }));
  if (limitsError) c.append(h("div", { class: "note warn", id: "limits-error", text: `Cannot read the limits: ${limitsError}` }));
  const doc = limitsDoc;
  if (!doc) { c.append(h("div", { class: "state muted", text: "Loading…" })); return; }
  if (!doc.limits.length) { c.append(h("div", { class: "state muted", id: "limits-empty", text: "No limit is declared in this log. Budgets and rate limits appear here once a saga runs with policies=[Budget(...), RateLimit(...)]." })); return; }
  const tbody = h("tbody");
  const row = (name, kind, key, period, words, used, held, max, remaining, fill) => h("tr", { dataset: { limit: name, key: key === null ? "" : key } },
    h("td", { class: "mono", text: name }), h("td", { text: kind }),
    h("td", { class: "mono meter-key", text: key === null ? "–" : key }),
    h("td", { text: words + (period ? ` (${period})` : "") }),
    h("td", { class: "num used", text: num(used) }), h("td", { class: "num held", text: num(held) }),
    h("td", { class: "num max", text: num(max) }), h("td", { class: "num remaining", text: num(remaining) }),
    h("td", { class: "bar" }, bar(ui, fill), h("span", { class: "small muted", text: `${Math.round(fill * 100)}%` })));
  for (const m of doc.meters) tbody.append(row(m.limit, m.kind, m.key, m.period, m.window_words, m.used, m.held, m.max, m.remaining, m.fill));
  for (const l of doc.limits) {
    if (l.meters === 0) tbody.append(row(l.limit, l.kind, null, null, l.window_words, 0, 0, l.max, l.max, l.max > 0 ? 0 : 1));
  }
  c.append(h("div", { class: "card" }, h("h2", { text: "Use now, per limit and key" }),
    h("div", { class: "table-wrap" }, h("table", { class: "limits", id: "limits" },
      h("thead", null, h("tr", null, ...["limit", "kind", "key", "window", "used", "held", "max", "remaining", "(used + held) / max"].map((x) => h("th", { text: x })))),
      tbody))));
  const defs = h("tbody");
  for (const l of doc.limits) {
    const what = l.kind === "budget" ? `sum of ${l.arg || "amount"}` : "calls";
    const keyed = l.key === "global" ? "one meter" : `a meter per ${l.key}`;
    defs.append(h("tr", { dataset: { limit: l.limit } }, h("td", { class: "mono", text: l.limit }), h("td", { text: l.kind }),
      h("td", { text: `${num(l.max)} ${what} per ${l.window_words}` }), h("td", { class: "mono", text: keyed }),
      h("td", { text: l.net ? "yes" : "no" }), h("td", { class: "mono small muted", text: l.digest })));
  }
  c.append(h("div", { class: "card" }, h("h2", { text: "Definitions" }),
    h("table", { class: "limits", id: "limit-defs" },
      h("thead", null, h("tr", null, ...["limit", "kind", "at most", "keyed", "net", "digest"].map((x) => h("th", { text: x })))), defs)));
}

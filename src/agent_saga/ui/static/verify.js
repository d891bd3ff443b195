// Verification against the log's checkpoints (docs/ui.md, docs/audit.md): a badge per
// saga — sealed, not yet sealed, TAMPERED with the finding — and the latest checkpoint
// that verified, in the header. Imported by app.js, which passes its h() helper in.
// Every value from the log is rendered with textContent (h's "text"), never as HTML.

const LABEL = { sealed: "sealed", unsealed: "not yet sealed", tampered: "TAMPERED" };
const TITLE = {
  sealed: "every record of this saga is covered by a signed checkpoint and still hashes to what it signed",
  unsealed: "some record of this saga comes after the latest checkpoint: signed by nothing yet (agent-saga wal seal)",
};

// The badge of a saga's verification state; `full` puts the finding into the text
// (the saga's page), otherwise it is the tooltip (the list).
export function verifyBadge(v, h, full) {
  if (!v || !v.state) return null;
  const tampered = v.state === "tampered";
  const finding = tampered ? String(v.finding || "its records fail verification") : "";
  const text = tampered && full ? `TAMPERED: ${finding}` : LABEL[v.state] || String(v.state);
  return h("span", {
    class: `vbadge v-${v.state}` + (full ? " full" : ""),
    dataset: { verification: v.state },
    title: tampered ? `TAMPERED: ${finding} — check the log with agent-saga wal verify` : TITLE[v.state] || "",
    text,
  });
}

// The header's checkpoint: the latest that verified, its time and key, and whether
// the key is pinned (AGENT_SAGA_AUDIT_KEY); a warning when a checkpoint fails.
export function renderCheckpoint(el, a, fmtTs, count) {
  if (!el) return;
  el.className = "checkpoint";
  if (!a) { el.hidden = true; return; }
  el.hidden = false;
  const cp = a.latest;
  const pin = a.pinned ? "pinned" : "key not pinned";
  let text = cp
    ? `checkpoint: ${count(cp.size, "leaf")} · ${fmtTs(cp.ts)} · ${cp.alg} ${cp.key_id} · ${pin}`
    : a.checkpoints ? `no checkpoint verified (${a.checkpoints} in the log)` : "no checkpoint: nothing signs this log";
  if (cp && !cp.signature_checked) text += " · signature not checked";
  const bad = (a.findings || []).length;
  if (bad) text += ` · ⚠ ${count(bad, "finding")}`;
  el.textContent = text;
  el.classList.toggle("bad", bad > 0);
  el.classList.toggle("weak", !a.pinned || Boolean(a.error));
  const lines = [
    cp ? `latest verified checkpoint: ${cp.size} leaves, root ${cp.root}, at ${cp.cursor_name} ${cp.cursor}` : "no checkpoint verified",
    `key: ${a.key}`,
    `${a.unsealed_leaves} leaves after it, signed by nothing yet`,
    ...(a.error ? [String(a.error)] : []),
    ...(a.findings || []).map((f) => `tampered: ${f}`),
  ];
  el.title = lines.join("\n");
}

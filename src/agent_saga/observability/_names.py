"""The names agent-saga's spans, events and metrics use (``docs/observability.md``).

OpenTelemetry GenAI names where the conventions define one; ``agent_saga.*`` for what
they leave open (sagas, compensations, approvals, recovery), in their style; and the
span-kind attributes three backends read to show the right icon and type.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BACKEND_KIND",
    "TRACER_NAME",
]

TRACER_NAME: Final = "agent_saga"

# --- OpenTelemetry GenAI semantic conventions (Development) -----------------------------
OPERATION: Final = "gen_ai.operation.name"
WORKFLOW_NAME: Final = "gen_ai.workflow.name"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
ERROR_TYPE: Final = "error.type"
EXECUTE_TOOL: Final = "execute_tool"
INVOKE_WORKFLOW: Final = "invoke_workflow"

GUARDRAIL_EVENT: Final = "gen_ai.guardrail.result"
GUARDRAIL_COMPONENT: Final = "gen_ai.guardrail.component.name"
GUARDRAIL_POLICY: Final = "gen_ai.guardrail.policy.id"
GUARDRAIL_RESULT_TYPE: Final = "gen_ai.guardrail.result.type"
GUARDRAIL_RESULT_VALUE: Final = "gen_ai.guardrail.result.value"
GUARDRAIL_REASON: Final = "gen_ai.guardrail.result.reason"
GUARDRAIL_SOURCE: Final = "gen_ai.guardrail.source"
GATE_COMPONENT: Final = "agent-saga gate"

# --- agent_saga.* (proposed in docs/observability.md) -----------------------------------
SAGA_ID: Final = "agent_saga.saga.id"
SAGA_OUTCOME: Final = "agent_saga.saga.outcome"
STEP: Final = "agent_saga.step"
STEP_SEMANTICS: Final = "agent_saga.step.semantics"
STEP_ATTEMPT: Final = "agent_saga.step.attempt"
STEP_OUTCOME: Final = "agent_saga.step.outcome"
FORWARD_OUTCOME: Final = "agent_saga.step.attempt.outcome"
COMPENSATION_TOOL: Final = "agent_saga.compensation.tool"
COMPENSATION_BY: Final = "agent_saga.compensation.by"
COMPENSATION_OUTCOME: Final = "agent_saga.compensation.outcome"
COMPENSATION_VERIFICATION: Final = "agent_saga.compensation.verification"
RECOVERY_BY: Final = "agent_saga.recovery.by"
UNDO_ID: Final = "agent_saga.undo.id"
UNDO_BY: Final = "agent_saga.undo.by"
UNDO_FROM_STEP: Final = "agent_saga.undo.from_step"
UNDO_OUTCOME: Final = "agent_saga.undo.outcome"
RETRY_ESCALATION: Final = "agent_saga.retry.escalation"
RETRY_OUTCOME: Final = "agent_saga.retry.outcome"
LINK_TYPE: Final = "agent_saga.link.type"
LINK_COMPENSATES: Final = "compensates"
LINK_RECOVERS: Final = "recovers"
LINK_UNDOES: Final = "undoes"
LINK_RETRIES: Final = "retries"
LINK_RESUMES: Final = "resumes"

#: Per operation after the saga's block: its link to the saga, who acts, the outcome.
OPERATIONS: Final = {
    "recover": (LINK_RECOVERS, RECOVERY_BY, SAGA_OUTCOME),
    "undo": (LINK_UNDOES, UNDO_BY, UNDO_OUTCOME),
    "retry": (LINK_RETRIES, RECOVERY_BY, RETRY_OUTCOME),
}
#: The engine's short names for an operation's ids (``_observe.recovering(detail=)``).
DETAIL: Final = {
    "undo": UNDO_ID,
    "from_step": UNDO_FROM_STEP,
    "escalation": RETRY_ESCALATION,
    "step": STEP,
}

APPROVAL_EVENT: Final = "agent_saga.approval"
APPROVAL_DECISION: Final = "agent_saga.approval.decision"
APPROVAL_BY: Final = "agent_saga.approval.by"
APPROVAL_APPROVER: Final = "agent_saga.approval.approver"
APPROVAL_DIGEST_MATCH: Final = "agent_saga.approval.digest_match"
ESCALATION_EVENT: Final = "agent_saga.escalation"
ESCALATION_ID: Final = "agent_saga.escalation.id"

# --- metrics ------------------------------------------------------------------------------
M_STEPS: Final = "agent_saga.steps"
M_COMPENSATIONS: Final = "agent_saga.compensations"
M_ESCALATIONS: Final = "agent_saga.escalations"
M_ESCALATIONS_OPEN: Final = "agent_saga.escalations.open"
M_APPROVALS_WAITING: Final = "agent_saga.approvals.waiting"
M_RECOVERY_LAG: Final = "agent_saga.recovery.lag"
M_LOG_SIZE: Final = "agent_saga.log.size"
M_LIMIT_USED: Final = "agent_saga.limit.usage"
M_LIMIT_UTILIZATION: Final = "agent_saga.limit.utilization"
LIMIT_NAME: Final = "agent_saga.limit.name"
LIMIT_STATE: Final = "agent_saga.limit.state"

# --- how backends show a span: OpenInference (Phoenix), LangSmith, Langfuse ---------------
BACKEND_KIND: Final = {
    "workflow": {
        "openinference.span.kind": "CHAIN",
        "langsmith.span.kind": "chain",
        "langfuse.observation.type": "chain",
    },
    "tool": {
        "openinference.span.kind": "TOOL",
        "langsmith.span.kind": "tool",
        "langfuse.observation.type": "tool",
    },
}

"""Framework adapters: drop agent-saga into an agent you already have.

One module per framework, each behind its own extra and imported only when you
import it (this package itself imports nothing outside the standard library):

=================================  ==================================================
``agent_saga.adapters.langgraph``  ``pip install 'sagaops-agent-saga[langgraph]'``
``agent_saga.adapters.openai_agents``  ``pip install 'sagaops-agent-saga[openai-agents]'``
``agent_saga.adapters.crewai``     ``pip install 'sagaops-agent-saga[crewai]'``
``agent_saga.adapters.llamaindex`` ``pip install 'sagaops-agent-saga[llamaindex]'``
``agent_saga.adapters.autogen``    ``pip install 'sagaops-agent-saga[autogen]'``
=================================  ==================================================

Each exposes the same two functions:

* ``wrap_tool(tool, *, semantics, compensate=None, **tool_options)`` returns a tool of
  the framework's own type, with the same name, description and argument schema,
  whose every invocation is one agent-saga step (``tool_options`` are ``@tool``'s);
* ``saga_run(target, input, **saga_options)``, a coroutine that runs the framework's
  agent on ``input`` as one saga and returns the framework's own result.

See ``docs/adapters.md``.
"""

from __future__ import annotations

from ._common import MissingExtra, step_idempotency_key

__all__ = ["MissingExtra", "step_idempotency_key"]

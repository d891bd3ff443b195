"""The gate policy a tool's ``limits`` table becomes: a maximum for a nested argument."""

from __future__ import annotations

from dataclasses import dataclass

from ..gate import ApprovalRequest
from .paths import PathError, parse_path

__all__ = ["ArgumentLimit", "argument_path"]


@dataclass(frozen=True, slots=True)
class ArgumentLimit:
    """Refuse a call of ``tool`` whose argument at ``argument`` exceeds ``limit``.

    Like :class:`~agent_saga.MaxArgument`, but the argument may be nested
    (``payment.amount``, ``items[0].qty``). A missing argument passes (the tool
    did not get one); a value that is not a number is refused.

    Args:
        argument: The argument's path inside the call's arguments.
        limit: The largest allowed value.
        tool: The tool it applies to.
    """

    argument: str
    limit: float
    tool: str

    @property
    def name(self) -> str:
        """The policy's name in the log."""
        return f"max-argument:{self.argument}<={self.limit:g}"

    def __call__(self, request: ApprovalRequest) -> str | None:
        """Return a refusal reason when the argument is over the limit."""
        if request.tool != self.tool:
            return None
        try:
            value = parse_path(argument_path(self.argument)).select(dict(request.kwargs))
        except PathError:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"argument {self.argument!r} of {request.tool!r} is not a number; refused"
        if value > self.limit:
            return f"argument {self.argument!r}={value:g} is above the limit {self.limit:g}"
        return None


def argument_path(arg: str) -> str:
    """The path (``agent_saga.mcp.paths``) of argument ``arg`` inside a call's arguments."""
    return "$" + (arg if arg.startswith("[") else "." + arg)

"""One exception hierarchy for the whole toolkit.

Why: callers must tell apart *bad input* (the user fixes a file; one-line message naming the
file, task and field) from *infrastructure failure* (a backend, endpoint or timeout broke; the
attempt is a system error, never a 0, always eligible for re-run). Everything raised on purpose
by tbhpc derives from `TbhpcError`.
"""
from __future__ import annotations


class TbhpcError(Exception):
    """Base of every error tbhpc raises on purpose."""


class UserError(TbhpcError):
    """Bad input from a user: a config, a task pack, a command-line value. One line."""


class PackError(UserError):
    """An invalid task pack. The message names file, task and field."""

    def __init__(self, file: str, message: str, task: str | None = None, field: str | None = None):
        self.file, self.task, self.field, self.detail = file, task, field, message
        where = [str(file)]
        if task is not None:
            where.append(f"task {task}")
        if field is not None:
            where.append(f"field {field}")
        super().__init__(": ".join(where) + ": " + message)


class InfraError(TbhpcError):
    """A failure of the infrastructure, not of the agent. Recorded as a system error."""

    kind = "infra"

    def __init__(self, message: str, cause: BaseException | None = None):
        self.cause = cause
        text = message if cause is None else f"{message}: {type(cause).__name__}: {cause}"
        super().__init__(text)


class BackendError(InfraError):
    """A domain backend raised something other than a business-rule error."""

    kind = "backend"


class ToolTimeout(InfraError):
    """A tool call ran past its time budget (the call may have executed)."""

    kind = "tool_timeout"


class EndpointError(InfraError):
    """An LLM endpoint (policy, simulated user or judge) failed after its retries."""

    kind = "endpoint"

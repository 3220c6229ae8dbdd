"""What a command's failure looks like to its user: one line and an exit code, decided here only.

- a `TbhpcError` (bad input, a system error a command could not get past): its message, its code (2)
- a broken pipe (`tbhpc tasks list | head`): quiet, 0
- an interrupt: "what finished is saved", 130 (also when DuckDB turned it into its own exception)
- a damaged results file met in the middle of a command: which file, how to rebuild it, 2
- an OSError about the user's paths or disk: the path and the reason, 2
- anything else is a bug in tbhpc: one line here, the traceback in a file (`tbhpc.crash`), 70;
  TBHPC_TRACEBACK=1 raises it instead.
"""
from __future__ import annotations

import errno
import os
import sys

from tbhpc import interrupts
from tbhpc.crash import EXIT_INTERNAL, crash_line
from tbhpc.errors import TbhpcError
from tbhpc.interrupts import EXIT_INTERRUPTED

# OSErrors that say something about the user's paths or disk, not about tbhpc
ENVIRONMENT_ERRNOS = {errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                      errno.ENOTDIR, errno.EISDIR, errno.ELOOP}
INTERRUPTED = "\ntbhpc: interrupted (what finished is saved; re-run the same command to resume)"


def exit_code(exc: BaseException) -> int:
    """Say what happened on stderr (one line) and return the command's exit status."""
    if isinstance(exc, TbhpcError):
        print(f"tbhpc: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    if isinstance(exc, BrokenPipeError):
        sys.stderr.close()
        return 0
    if isinstance(exc, KeyboardInterrupt) or interrupts.pending():
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    from tbhpc.store.health import damage_error, is_damage
    if is_damage(exc):
        print(f"tbhpc: error: {damage_error(exc)}", file=sys.stderr)
        return 2
    if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS:
        from tbhpc.outpaths import short
        where = f"{short(str(exc.filename))}: " if exc.filename else ""
        print(f"tbhpc: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    if os.environ.get("TBHPC_TRACEBACK"):
        raise exc
    print(f"tbhpc: internal error (a bug in tbhpc, not in your input): {crash_line(exc)}", file=sys.stderr)
    return EXIT_INTERNAL

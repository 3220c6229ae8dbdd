"""What a user sees when tbhpc itself is wrong: one line, and the whole traceback in a file.

Why: bad input has its own one-line errors (`tbhpc.errors`); anything else that escapes a
command is a bug. A wall of traceback hides the one line that matters and mixes with the
command's output, yet the traceback is what a bug report needs. So the command prints the
exception's type and message, says where the full traceback was written, and exits with
EX_SOFTWARE (70). `TBHPC_TRACEBACK=1` re-raises instead (for debugging); `TBHPC_CRASH_DIR`
chooses the folder (default: the system's temporary folder).
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

EXIT_INTERNAL = 70


def crash_dir() -> Path:
    return Path(os.environ.get("TBHPC_CRASH_DIR") or tempfile.gettempdir())


def write_traceback(exc: BaseException, folder: Path | None = None) -> Path:
    """The full traceback (causes included: a worker's remote traceback is one) in a new file."""
    folder = folder or crash_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"tbhpc-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    path.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
    return path


def crash_line(exc: BaseException) -> str:
    """`Type: message; full traceback in PATH` (or why it could not be written)."""
    message = " ".join(str(exc).split())[:300]
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    try:
        where = f"full traceback in {write_traceback(exc)}"
    except OSError as err:
        where = f"the traceback could not be written ({err}); run with TBHPC_TRACEBACK=1 to see it"
    return f"{head}; {where}"

"""`tbhpc` command line: thin wrappers over the packages below it (tasks, campaigns, training,
serving). Each command is one module here with `add_parser` and `run`; `main` dispatches and
`failures` decides what an error looks like. No logic lives here beyond turning flags into
objects and results into text or JSON."""
from __future__ import annotations

import os
import sys


def _interrupted_while_starting(signum, frame) -> None:  # pragma: no cover - a subprocess's first second
    sys.stderr.write("\ntbhpc: interrupted while starting (nothing was run)\n")
    os._exit(130)


# A Ctrl-C while the command's modules still import (up to a second) ends it in one line; main()
# installs the real handler first thing. Only when this process is the `tbhpc` command
# (`python -m tbhpc.cli` sets argv[0] to "-m" while the package imports).
if sys.argv and (sys.argv[0] == "-m" or os.path.basename(sys.argv[0] or "") == "tbhpc"):
    import signal
    signal.signal(signal.SIGINT, _interrupted_while_starting)

from tbhpc.cli.main import build_parser, entry, main  # noqa: E402  (after the handler: these import the commands)

__all__ = ["build_parser", "entry", "main"]

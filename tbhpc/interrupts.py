"""Ctrl-C that ends a command cleanly: the first stops the workers, the second exits at once.

Why: a campaign's local executor runs a pool of worker processes. Left to Python's defaults an
interrupt reaches the workers (a terminal sends it to the whole process group) while one of them
holds the pool's queue lock, the rest block on it and the pool never shuts down; a second Ctrl-C
then kills only the main process and leaves the workers running under PID 1. Here workers ignore
SIGINT (`ignore_in_worker`), the main process owns the interrupt: it terminates its children
(`stop_children`), merges what finished (shards are atomic, so nothing half-written is kept) and
exits with status 130. While that cleanup runs a second Ctrl-C kills the children and exits
immediately (`second_interrupt_exits`).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from tbhpc.errors import TbhpcError

EXIT_INTERRUPTED = 130

# Some C extensions swallow a KeyboardInterrupt raised inside code they call: DuckDB imports
# pandas lazily while binding a query's parameters and treats any failure of that import as
# "no pandas". So the handler also remembers the interrupt, and the campaign checks the flag.
_pending = False


def _on_sigint(signum, frame) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


def install() -> None:
    """The SIGINT handler of a tbhpc command (main thread only): Python's, plus a memory of it."""
    try:
        signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread (tbhpc called from a library's thread)
        pass


def pending() -> bool:
    """True once a SIGINT arrived, even if something swallowed its KeyboardInterrupt."""
    return _pending


def check() -> None:
    """Raise the KeyboardInterrupt a C extension swallowed, if one did."""
    if _pending:
        raise KeyboardInterrupt


class Interrupted(TbhpcError):
    """The user pressed Ctrl-C (or the command got SIGINT); finished work is saved."""

    exit_code = EXIT_INTERRUPTED


def ignore_in_worker() -> None:
    """Called first in every worker process: the main process decides what an interrupt means."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a held one is now discarded


@contextmanager
def workers_born_ignoring_sigint() -> Iterator[None]:
    """Processes started inside the block start with SIGINT blocked (a signal mask survives exec,
    a handler does not) until `ignore_in_worker` ignores it, so a Ctrl-C while they import cannot
    print a traceback from them (the resource tracker of multiprocessing starts the same way).
    A SIGINT to this process inside the block is held and raised once the block ends: the mask
    holds one aimed at this thread, and a handler that only records holds one the kernel gives to
    another thread (rich's refresher: Python would still raise it here, in the middle of a
    Process.start(), and the half-started child would die with a traceback)."""
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()  # now, not inside the block: starting it unblocks SIGINT
    held: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except ValueError:                 # not the main thread: no handler of ours runs here anyway
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if signal.SIGINT in signal.sigpending():
            signal.sigwait({signal.SIGINT})    # consume the one the mask held (it is blocked: no race)
            held.append(signal.SIGINT)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        signal.signal(signal.SIGINT, previous)
        if held and previous is not signal.SIG_IGN:   # now what the interrupt would have done
            if callable(previous):
                previous(signal.SIGINT, None)
            raise KeyboardInterrupt


def release_multiprocessing_resources() -> None:
    """What multiprocessing does at a normal exit, for an exit through os._exit: the named
    semaphores of pools and queues still referenced (from a traceback, say) are unlinked and
    unregistered, so the resource tracker has no 'leaked semaphore' warning to print after us."""
    from multiprocessing import util
    try:
        util._run_finalizers(0)   # exit priority >= 0: SemLock clean-ups, queue closes (not joins)
    except Exception:
        pass


def stop_children(grace_s: float = 2.0) -> int:
    """Terminate this process's multiprocessing children (SIGTERM, then SIGKILL after `grace_s`).
    Returns how many there were."""
    children = mp.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(grace_s)
        if child.is_alive():
            child.kill()
            child.join(1.0)
    return len(children)


# One Ctrl-C can arrive twice: `timeout -s INT` signals the command and then its whole process
# group, microseconds apart. A repeat within this window is the same interrupt, not a second one.
SAME_INTERRUPT_S = 0.25
_cleanup_started: float | None = None


def _exit_now(signum, frame) -> None:  # pragma: no cover - exercised through a subprocess
    if _cleanup_started is not None and time.monotonic() - _cleanup_started < SAME_INTERRUPT_S:
        return
    for child in mp.active_children():
        try:
            child.kill()
        except Exception:
            pass
    try:
        sys.stderr.write("\ntbhpc: interrupted again: stopped at once (finished shards are kept; "
                         "re-run the same command to resume)\n")
        sys.stderr.flush()
        release_multiprocessing_resources()
    finally:
        os._exit(EXIT_INTERRUPTED)


@contextmanager
def second_interrupt_exits() -> Iterator[None]:
    """Within the block, SIGINT kills the children and exits the process at once."""
    global _cleanup_started
    if _cleanup_started is None:
        _cleanup_started = time.monotonic()
    try:
        previous = signal.signal(signal.SIGINT, _exit_now)
    except ValueError:  # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)

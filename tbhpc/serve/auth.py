"""The run's token: the one secret every client of a run's policy server presents.

Why: on a shared cluster every user who can log in can reach a compute node's ports, and the
policy server's admin routes (weight reloads, `/collective_rpc`, pause/resume) steer the policy a
training run samples from. The server (tbhpc_auth.RequireRunToken, inside vLLM) answers only
requests that carry `Authorization: Bearer <token>`; the token lives in one file of the run
directory that only its owner can read, so whoever can read the run's checkpoints can also
steer its server, and nobody else can. The token itself is never written anywhere else: not in
endpoint.json (which names the file), logs, job scripts, command lines or the results database.
docs/security.md is the threat model.
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from tbhpc.errors import UserError

TOKEN_FILENAME = "server.token"
TOKEN_BYTES = 32


def token_path(run_dir: Path | str) -> Path:
    return Path(run_dir) / TOKEN_FILENAME


def ensure_token(run_dir: Path | str) -> Path:
    """The run's token file, created on first use (32 random bytes, mode 0600, written whole
    before it appears, so a reader racing the creator never sees half a token). The run directory
    loses write access for others: a directory anyone can write lets them replace endpoint.json
    or the token itself."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    mode = run.stat().st_mode
    if mode & stat.S_IWOTH:
        if run.stat().st_uid != os.getuid():
            raise UserError(f"{run}: the run directory is writable by every user and not yours; use a directory of your own")
        os.chmod(run, stat.S_IMODE(mode) & ~stat.S_IWOTH)
    path = token_path(run)
    if not path.exists():
        tmp = run / f".tmp-{TOKEN_FILENAME}-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, (secrets.token_urlsafe(TOKEN_BYTES) + "\n").encode())
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)          # fails if another process made it first: theirs stands
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    read_token(path)                    # an existing file with loose permissions is refused here, not later
    return path


def read_token(path: Path | str) -> str:
    """The token in `path`; refuses a file other users could read (as ssh refuses a loose key)."""
    p = Path(path)
    try:
        st = p.stat()
        text = p.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UserError(f"{p}: cannot read the run's server token ({exc.strerror or exc})") from None
    if st.st_mode & 0o077:
        raise UserError(f"{p}: mode {stat.S_IMODE(st.st_mode):04o} lets other users read the run's server token; "
                        f"run `chmod 600 {p}`")
    if len(text) < 32:
        raise UserError(f"{p}: not a server token (too short)")
    return text


def bearer(token: str) -> dict[str, str]:
    """The request header a token travels in ({} without one: a server of your own without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


"""Which trackers exist, what installs each, and where each may write: decided before a run starts.

Why a module of its own: compute nodes often have no route out, and the trackers behave badly
there unless told (measured: wandb online with no network blocks `wandb.init` ~100 s and then
raises; mlflow looks up a telemetry host; trackio on NFS or Lustre silently changes its storage
to JSONL fragments). So the decisions are made here, from the environment, as a pure function
(`placement`) the tests and `tbhpc doctor` can call with any facts, and applied to the process
environment once, before a tracker's package is imported. A variable the user set always wins.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from tbhpc.errors import UserError


@dataclass(frozen=True)
class TrackerSpec:
    module: str          # what must import
    extra: str           # the pyproject extra that installs it


TRACKERS = {
    "tensorboard": TrackerSpec("tensorboard", "train"),
    "trackio": TrackerSpec("trackio", "tracking"),
    "wandb": TrackerSpec("wandb", "tracking"),
    "mlflow": TrackerSpec("mlflow", "tracking"),
}


def check_trackers(names: list[str], origin: str) -> None:
    """Refuse an unknown tracker (with the closest name) or one whose package is missing (with the
    extra that installs it): before the run directory exists, in one line."""
    for name in names:
        if name not in TRACKERS:
            close = difflib.get_close_matches(str(name), list(TRACKERS), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise UserError(f"{origin}: field 'trackers': unknown tracker {name!r}; {hint}"
                            f"(known: {', '.join(TRACKERS)})")
        spec = TRACKERS[name]
        if importlib.util.find_spec(spec.module) is None:
            raise UserError(f"{origin}: field 'trackers': {name} is not installed here "
                            f"(pip install 'tbhpc[{spec.extra}]'; `make env` installs every extra)")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"{origin}: field 'trackers': {dupes[0]!r} is named twice")


def trackers_dir(run_path: Path) -> Path:
    return run_path / "trackers"


@dataclass(frozen=True)
class NetworkFacts:
    under_slurm: bool        # SLURM_JOB_ID set: a compute node, often cut off
    has_route: bool          # a default route exists (read from /proc/net/route: nothing is contacted)
    wandb_key: bool          # WANDB_API_KEY, or a netrc entry `wandb login` wrote


@dataclass(frozen=True)
class Placement:
    env: dict[str, str] = field(default_factory=dict)     # variables to set (only ones the user left unset)
    notes: list[str] = field(default_factory=list)        # one line per tracker: where it writes and why


def placement(names: list[str], run_path: Path, environ: Mapping[str, str], facts: NetworkFacts) -> Placement:
    """Where each tracker writes and whether it may go online. Offline unless it can work: wandb
    goes online only off Slurm, with a route and a key (else offline in the run directory, uploaded
    later by `tbhpc tracker-sync`); trackio writes SQLite in the run directory; mlflow a sqlite store
    there unless a tracking URI is given; telemetry off."""
    env: dict[str, str] = {}
    notes: list[str] = []
    home = trackers_dir(run_path)

    def default(key: str, value: str) -> str:
        if key not in environ:
            env[key] = value
            return value
        return environ[key]

    for name in names:
        if name == "tensorboard":
            notes.append(f"tensorboard: event files in {run_path / 'tensorboard'}")
        elif name == "trackio":
            where = default("TRACKIO_DIR", str(home / "trackio"))
            default("TRACKIO_STORAGE_MODE", "sqlite")      # on NFS/Lustre trackio would switch to JSONL fragments
            notes.append(f"trackio: SQLite in {where} (dashboard: TRACKIO_DIR={where} trackio show)")
        elif name == "wandb":
            default("WANDB_DIR", str(home))
            default("WANDB_SILENT", "true")                # the console lines are the trainer's
            mode, why = _wandb_mode(environ, facts)
            if "WANDB_MODE" not in environ:
                env["WANDB_MODE"] = mode                   # the process-wide mode also stops its telemetry
            if mode == "offline":
                default("WANDB_CACHE_DIR", str(home / "wandb-cache"))
                default("WANDB_DATA_DIR", str(home / "wandb-data"))
            notes.append(f"wandb: {mode} ({why})" + (f"; upload later: tbhpc tracker-sync {run_path}"
                                                    if mode == "offline" else ""))
        elif name == "mlflow":
            default("MLFLOW_DISABLE_TELEMETRY", "true")
            uri = default("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
            notes.append(f"mlflow: {uri}" + (" (MLFLOW_TRACKING_URI)" if "MLFLOW_TRACKING_URI" in environ else ""))
    return Placement(env, notes)


def _wandb_mode(environ: Mapping[str, str], facts: NetworkFacts) -> tuple[str, str]:
    if "WANDB_MODE" in environ:
        return environ["WANDB_MODE"], "WANDB_MODE"
    if facts.under_slurm:
        return "offline", "under Slurm"
    if not facts.has_route:
        return "offline", "no network route"
    if not facts.wandb_key:
        return "offline", "no W&B key: WANDB_API_KEY or `wandb login`"
    return "online", "a route and a key"


def network_facts(environ: Mapping[str, str] = os.environ) -> NetworkFacts:
    """The facts `placement` needs, read without contacting anything."""
    return NetworkFacts(under_slurm=bool(environ.get("SLURM_JOB_ID")), has_route=_default_route(),
                        wandb_key=bool(environ.get("WANDB_API_KEY")) or _netrc_has("api.wandb.ai", environ))


def _default_route(path: str = "/proc/net/route") -> bool:
    try:
        lines = Path(path).read_text().splitlines()[1:]
    except OSError:
        return True                  # not Linux: assume a route, and let the key decide
    return any(len(f := line.split()) > 1 and f[1] == "00000000" for line in lines)


def _netrc_has(host: str, environ: Mapping[str, str]) -> bool:
    path = Path(environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return host in path.read_text()
    except OSError:
        return False


def apply(place: Placement) -> None:
    """Set the decided variables in this process (and so in every tracker's helper process),
    before any tracker's package is imported: trackio reads TRACKIO_DIR at import."""
    for key, value in place.env.items():
        os.environ.setdefault(key, value)

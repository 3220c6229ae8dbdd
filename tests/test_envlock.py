"""Locked environments (tbhpc/envlock.py): every lock is current with pyproject.toml, a stale one
stops `make test` in one line before anything installs, the trainer's environment `make env`
built is exactly its lock (torch's local build label aside), the locks name no machine's paths,
and `tbhpc doctor` names a package that differs from the lock."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tbhpc.envlock import ENVS, env_named, inputs_hash, read_lock, read_pyproject, requirements, stale

REPO = Path(__file__).resolve().parents[1]


def _checkout(tmp_path: Path) -> Path:
    """The files the lock check reads, in a directory of their own."""
    repo = tmp_path / "repo"
    (repo / "tbhpc").mkdir(parents=True)
    for f in ("pyproject.toml", "Makefile", "tbhpc/__init__.py", "tbhpc/envlock.py"):
        shutil.copy(REPO / f, repo / f)
    shutil.copytree(REPO / "env" / "locks", repo / "env" / "locks")
    return repo


def test_every_lock_is_current():
    assert stale() == []
    res = subprocess.run([sys.executable, "-m", "tbhpc.envlock", "--check"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == ""


def test_a_planted_stale_lock_stops_make_test_in_one_line_before_anything_installs(tmp_path):
    repo = _checkout(tmp_path)
    lock = repo / "env" / "locks" / "trainer-cpu.txt"
    lock.write_text(re.sub(r"^# inputs: \w+$", "# inputs: 0123456789abcdef", lock.read_text(), flags=re.M))
    res = subprocess.run(["make", "test"], cwd=repo, capture_output=True, text=True, timeout=120)
    errors = [line for line in res.stderr.splitlines() if line.startswith("tbhpc: error:")]
    assert res.returncode != 0 and errors == [
        "tbhpc: error: env/locks/trainer-cpu.txt is stale: pyproject.toml changed what .venv asks for (hf, test, mpi, "
        "gguf, train, bench, mcp, submitit, openenv, docs, tracking and the core dependencies); run `make lock` and "
        "commit env/locks"], res.stderr
    assert not (repo / ".venv").exists()          # refused before anything was built


def test_a_changed_pin_makes_exactly_the_locks_that_install_it_stale(tmp_path):
    repo = _checkout(tmp_path)
    text = (repo / "pyproject.toml").read_text()
    assert '"vllm==0.32.0"' in text
    (repo / "pyproject.toml").write_text(text.replace('"vllm==0.32.0"', '"vllm==0.32.1"'))
    lines = stale(repo)
    assert len(lines) == 1 and lines[0].startswith("env/locks/vllm-cuda.txt is stale"), lines
    (repo / "pyproject.toml").write_text(text.replace('"rich==14.2.0"', '"rich==14.1.0"'))
    assert sorted(line.split()[0] for line in stale(repo)) == ["env/locks/openenv.txt", "env/locks/trainer-cpu.txt",
                                                               "env/locks/trainer-cuda.txt"]


def test_every_pin_of_pyproject_is_in_its_lock_and_no_lock_names_a_machine():
    project = read_pyproject()
    for env in ENVS:
        made_from, pins = read_lock(env.path)
        assert made_from == inputs_hash(project, env)
        for req in requirements(project, env):
            name, version = req.split("==")
            assert pins[re.sub(r"[-_.]+", "-", name).lower()] == version, (env.name, req)
        text = env.path.read_text()
        assert not re.search(r"(/opt/|/tmp/|/root/|/work/|file:|--find-links|--index-url|https?://)", text), env.name
    assert read_lock(env_named("trainer-cpu").path)[1]["torch"].endswith("+cpu")
    cuda = read_lock(env_named("trainer-cuda").path)[1]
    assert cuda["torch"] == "2.13.0" and any(n.startswith("nvidia-") for n in cuda)


def _freeze(python: str) -> dict[str, str]:
    out = subprocess.run([python, "-m", "pip", "freeze", "--all", "--exclude-editable"], capture_output=True, text=True,
                         check=True).stdout
    return {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in re.findall(r"^([A-Za-z0-9][\w.-]*)==(\S+)$", out, re.M)}


def test_the_trainer_environment_is_its_lock():
    """What `make env` built (`make test` builds it first) is the lock: pip freeze names every locked
    package at its version and nothing else; lock entries for another platform (Windows, macOS)
    are the only ones missing."""
    if not Path(sys.prefix, ".installed").exists():
        pytest.skip("not the environment `make env` builds")
    _, locked = read_lock(env_named("trainer-cpu").path)
    have = _freeze(sys.executable)
    have.pop("pip")                            # the installer, upgraded before anything is installed
    assert {n: v for n, v in have.items() if locked.get(n) != v} == {}
    missing = sorted(set(locked) - set(have))
    text = env_named("trainer-cpu").path.read_text()
    for name in missing:                       # each one is marked for another platform in the lock
        line = next(line for line in text.splitlines() if re.sub(r"[-_.]+", "-", line.split("==")[0]).lower() == name)
        assert re.search(r"; (sys_platform|platform_system|os_name) ?[!=]=", line), line


def test_doctor_names_each_package_that_differs_from_the_lock(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "tbhpc.cli", "doctor"], cwd=REPO, capture_output=True, text=True, timeout=120)
    if Path(sys.prefix, ".installed").exists():
        assert "as locked (" in ok.stdout, ok.stdout
    lock = tmp_path / "planted.txt"
    text = env_named("trainer-cpu").path.read_text()
    version = read_lock(env_named("trainer-cpu").path)[1]["rich"]
    lock.write_text(text.replace(f"\nrich=={version}\n", "\nrich==1.0.0\n"))
    res = subprocess.run([sys.executable, "-m", "tbhpc.cli", "doctor", "--lock", str(lock)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert f"differs: rich {version} is installed, the lock says 1.0.0" in res.stdout, res.stdout

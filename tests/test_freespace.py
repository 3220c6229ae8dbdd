"""Room on disk for `make test` (tbhpc/freespace.py): a disk without it stops `make test` in one line
naming the filesystem, what is free and what each part still to be built needs, before anything is
written; parts already built need nothing more. Measured against the real free space of this disk."""
import shutil
import subprocess
import sys
from pathlib import Path

from tbhpc.freespace import GB, PARTS, shortfalls

REPO = Path(__file__).resolve().parents[1]


def _free_gb(path: Path) -> float:
    return shutil.disk_usage(path).free / GB


def test_a_disk_without_room_stops_make_test_in_one_line_before_anything_installs(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tbhpc").mkdir(parents=True)
    for f in ("pyproject.toml", "Makefile", "tbhpc/__init__.py", "tbhpc/envlock.py", "tbhpc/freespace.py"):
        shutil.copy(REPO / f, repo / f)
    shutil.copytree(REPO / "env" / "locks", repo / "env" / "locks")
    more_than_free = _free_gb(tmp_path) + 100
    res = subprocess.run(["make", "test", f"TEST_SCRATCH_GB={more_than_free:.0f}"], cwd=repo,
                         capture_output=True, text=True, timeout=120)
    errors = [line for line in res.stderr.splitlines() if line.startswith("tbhpc: error:")]
    assert res.returncode != 0 and len(errors) == 1, res.stderr
    line = errors[0]
    assert " GB free on the filesystem of " in line and "free some space and run it again" in line
    for part in PARTS:                              # nothing built yet: every part is named with its size
        assert f"{part.path} {part.gb:.1f}" in line, line
    assert not (repo / ".venv").exists() and not (repo / "build").exists()


def test_parts_already_built_need_no_room_and_enough_room_passes(tmp_path):
    repo = tmp_path / "repo"
    for part in PARTS:
        (repo / part.path).mkdir(parents=True)
    lines = shortfalls(repo, scratch=tmp_path, scratch_gb=_free_gb(tmp_path) + 100)
    assert len(lines) == 1 and "the tests' scratch" in lines[0]
    assert not any(part.path in lines[0].split("(", 1)[1] for part in PARTS), lines[0]
    assert shortfalls(repo, scratch=tmp_path, scratch_gb=0.001) == []


def test_this_checkout_has_room_for_its_own_suite():
    res = subprocess.run([sys.executable, "-m", "tbhpc.freespace", "--scratch-gb", "0.001"], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == ""

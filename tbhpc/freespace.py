"""Free disk for `make test`, checked before anything installs.

Why: a fresh `make test` writes several GB (three environments, the container image, the tests'
scratch), and on a nearly full disk the first sign is pip's `No space left on device` in the middle
of three parallel installs, beside debootstrap's `Couldn't download` warnings: nothing there names
the disk. This check names it, in one line, with what each part needs and what is free, before
anything is written. A part already built needs nothing more. The sizes are what each part took on
the dev VM (docs/measurements/cpu-classes.md); they are a floor, not a promise.
Standard library only: it runs before any environment exists.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GB = 1024 ** 3


@dataclass(frozen=True)
class Part:
    path: str          # relative to the checkout; needs nothing once it exists
    gb: float          # its size when built


PARTS = (Part(".venv", 2.4), Part(".venv-vllm", 3.5), Part(".venv-openenv", 0.6), Part("build/images/bookworm", 0.2))
SCRATCH_GB = 4.0       # the tests' temporary files (pytest's 3.8 GB in one run) and pip's unpacked wheels


def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def shortfalls(repo: Path = REPO, scratch: Path | None = None, scratch_gb: float = SCRATCH_GB) -> list[str]:
    """One line per filesystem that has less free space than the parts still to be built there need."""
    scratch = Path(scratch or tempfile.gettempdir())
    needs: dict[int, tuple[Path, list[tuple[str, float]]]] = {}
    todo = [(p.path, p.gb, repo / p.path) for p in PARTS if not (repo / p.path).exists()]
    todo.append(("the tests' scratch", scratch_gb, scratch))
    for name, gb, target in todo:
        where = _existing(target)
        needs.setdefault(os.stat(where).st_dev, (where, []))[1].append((name, gb))
    lines = []
    for where, parts in needs.values():
        free = shutil.disk_usage(where).free / GB
        total = sum(gb for _, gb in parts)
        if free < total:
            each = ", ".join(f"{name} {gb:.1f}" for name, gb in parts)
            lines.append(f"{free:.1f} GB free on the filesystem of {where}; this run needs about {total:.1f} GB there "
                         f"({each}): free some space and run it again")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tbhpc.freespace", description="is there room for `make test`?")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout that will be built (default: this one)")
    ap.add_argument("--scratch-gb", type=float, default=SCRATCH_GB, help="room the tests need in the temp directory")
    args = ap.parse_args(argv)
    lines = shortfalls(args.repo, scratch_gb=args.scratch_gb)
    for line in lines:
        print(f"tbhpc: error: {line}", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a command may write: checked before anything is written, never a user's file lost.

Why: unchecked, an empty `--out ''` means "the current directory", a pool file can replace any
file (a pack file becomes an empty pool), reports and exports mix their files into any folder, and
an `--out` that is a file ends in a traceback. Each kind of output names the entries it owns; a
folder is fit when it does not exist, is empty, or holds only such entries (the previous output
of the same command, which is rewritten). Anything else is refused in one line naming the path
and what is in the way, unless the command was given `--force`.
"""
from __future__ import annotations

import fnmatch
import json
import os
from pathlib import Path

from tbhpc.errors import UserError

# What each command writes into its folder (glob patterns of top-level names).
OWNED: dict[str, tuple[str, ...]] = {
    "report": ("report.md", "report.html", "*.png", "failures.html", "tasks"),
    "parquet": ("*.parquet",),
    "tb-data": ("dataset", "servers.yaml", "testlist.yaml", "tests"),
    "pack": ("*.yaml", "eval_ids.txt"),
    "model": ("config.json", "generation_config.json", "*.safetensors", "*.bin", "tokenizer*", "vocab.json",
              "merges.txt", "special_tokens_map.json", "chat_template.jinja", "added_tokens.json", "*.txt", "*.json",
              "logs"),
    "demo": ("demo.json", "pool.yaml", "pool.manifest.json", "train.yaml", "report", "probe-report", "probe", "train",
             "eval-*", "fresh-*", "sft-baseline", "sample-*.txt", "candidates-*"),
    # a run directory (tbhpc.store.run_dir) and what `tbhpc submit` writes into it before the first merge
    "run": ("config.yaml", "config.hash", "campaign.json", "plan.jsonl", "tasks.json", "shards", "blobs", "logs",
            "results.duckdb", "results.duckdb.wal", "results.duckdb.damaged-*", "results.duckdb.tmp", ".merge.lock",
            "slurm", ".tmp-*", "report", "buffers",
            "checkpoints", "ds_checkpoints", "exports", "evals", "tensorboard", "serve.yaml", "train.yaml",
            "vllm-server.log", "endpoint.json",      # the serving job of a training run may start first
            "server.token"),                         # made with the run directory (serve/auth.py)
}


# probe and eval runs are both campaigns: which one a folder holds is the identity check's to say
CAMPAIGN_KINDS = {"probe", "eval"}


def out_arg(text: str) -> Path:
    """argparse `type=` for output paths: an empty or blank value is an error (Path('') is '.'), and
    so is a path the file system cannot hold."""
    import argparse
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (it would mean the current directory); name a folder")
    try:
        check_path_fits(Path(text), "")
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc).strip()) from None
    return Path(text)


def short(text: str, keep: int = 24) -> str:
    """A name cut for a one-line message."""
    return text if len(text) <= 2 * keep else f"{text[:keep]}...{text[-8:]} ({len(text)} characters)"


def _name_max(path: Path) -> int:
    """NAME_MAX of the file system the path would be on (its nearest existing folder)."""
    for parent in path.absolute().parents:
        try:
            if parent.is_dir():
                return os.pathconf(parent, "PC_NAME_MAX")
        except (OSError, ValueError):
            continue
    return 255


def check_path_fits(path: Path, flag: str) -> Path:
    """A path the file system can hold: no NUL byte, every name within its NAME_MAX bytes, the whole
    within PATH_MAX (else the first write would fail half-way with ENAMETOOLONG)."""
    text = str(path)
    lead = f"{flag} " if flag else ""
    if "\0" in text:
        raise UserError(f"{lead}{short(text)!r}: a path cannot hold a NUL byte")
    limit = _name_max(path)
    for part in path.parts:
        if len(os.fsencode(part)) > limit:
            raise UserError(f"{lead}{short(text)}: the name {short(part)} is longer than this file system allows "
                            f"({limit} bytes)")
    if len(os.fsencode(str(path.absolute()))) >= 4096:
        raise UserError(f"{lead}{short(text)}: the path is longer than the system allows (4096 bytes)")
    return path


def _foreign(folder: Path, kind: str) -> list[str]:
    pats = OWNED[kind]
    return sorted(e.name for e in folder.iterdir() if not any(fnmatch.fnmatch(e.name, p) for p in pats))


def _listing(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _parents_are_folders(path: Path, flag: str) -> None:
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise UserError(f"{flag} {path}: {parent} is a file, not a folder")


def check_folder_path(path: Path, flag: str) -> None:
    """A path that can be a folder: it fits the file system, and neither it nor a parent is a file."""
    check_path_fits(path, flag)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: is a file, not a folder")
    _parents_are_folders(path, flag)


def check_output_folder(path: Path, kind: str, flag: str = "--out", force: bool = False) -> Path:
    """A folder for an output of `kind` (a key of OWNED): missing, empty, or a previous one."""
    check_folder_path(path, flag)
    if path.is_dir() and not force and (foreign := _foreign(path, kind)):
        raise UserError(f"{flag} {path}: not empty and not a previous {kind} output (it holds {_listing(foreign)}); "
                        f"choose a new folder, or add --force to write into it anyway")
    return path


def check_run_folder(path: Path, kind: str | None = None, flag: str = "--out") -> Path:
    """A run directory to create or resume: missing, empty, a run (of `kind`, when given), or a
    folder holding only what `tbhpc submit` writes before the run's first files."""
    check_folder_path(path, flag)
    if not path.is_dir():
        return path
    meta = path / "campaign.json"
    if meta.is_file():
        try:
            have = json.loads(meta.read_text(encoding="utf-8")).get("kind")
        except (OSError, ValueError, AttributeError):
            raise UserError(f"{flag} {path}: campaign.json is not readable JSON: not a run tbhpc can resume") from None
        if kind is not None and have is not None and have != kind and not {have, kind} <= CAMPAIGN_KINDS:
            raise UserError(f"{flag} {path}: holds a run of kind {have!r}, not {kind!r}; use a new folder")
        return path
    if foreign := _foreign(path, "run"):
        raise UserError(f"{flag} {path}: not empty and not a run directory (it holds {_listing(foreign)}); "
                        f"use a new or empty folder")
    return path


def check_output_file(path: Path, is_ours, flag: str = "--out", force: bool = False) -> Path:
    """A file to (re)write: missing, or one `is_ours(path)` recognises as this command's output."""
    check_path_fits(path, flag)
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a folder, not a file")
    _parents_are_folders(path, flag)
    if path.exists() and not force and not is_ours(path):
        raise UserError(f"{flag} {path}: exists and was not written by this command; choose another name, "
                        f"or add --force to replace it")
    return path

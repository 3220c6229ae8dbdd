"""HDF5 rollout buffers: one file per training step, episodes stored token-exact.

Layout of `buffers/step-NNNNNN.h5` (written to a temp file and renamed: a step file is whole or
absent, like a shard):

    attrs: step, policy_version, created, n_episodes, n_tokens
    /tokens      int32   [T]   every episode's token ids, concatenated (prompt + response)
    /loss_mask   uint8   [T]   1 on tokens the policy generated, 0 on prompt/tool/user tokens
    /logprobs    float32 [T]   behaviour log-probabilities (0 where loss_mask is 0)
    /versions    int32   [T]   the weight version (step) that sampled each token; -1 where loss_mask is 0
    /offsets     int64   [E+1] episode i is tokens[offsets[i]:offsets[i+1]]
    /episodes/   per episode [E]: group int32, reward float32, advantage float32,
                 policy_version int32 (its oldest token's), newest_version int32, switches int32
                 (version changes along its tokens), reissued int32 (turns issued again after a
                 sync), reprefilled int32 (tokens prefilled again), task_id, attempt_key,
                 finish_reason (UTF-8 strings)

Why a version per token: with `max_staleness` k > 1 an episode runs on across weight syncs, so
its turns (and, under `pause_mode: keep`, the two halves of one turn) come from different
versions; the trainer's staleness figures and the bound are per token. Files of layout v1 (no
/versions) read back with every generated token at the episode's policy_version.

Token arrays are chunked (64 Ki elements) and compressed (gzip level 4 by default, or lzf), so a
reader can stream a step without loading it whole. Why CSR (flat + offsets) and not padding:
episodes differ in length by 10-100x in agentic RL, and padding would dominate the file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np

CHUNK = 1 << 16
STR = h5py.string_dtype("utf-8")


@dataclass
class Episode:
    tokens: np.ndarray          # int
    loss_mask: np.ndarray       # 0/1
    logprobs: np.ndarray        # float
    group: int
    reward: float
    advantage: float = 0.0
    task_id: str = ""
    attempt_key: str = ""
    finish_reason: str = ""
    policy_version: int = 0     # the oldest version that sampled any of its tokens
    versions: np.ndarray | None = None   # int per token: the version that sampled it, -1 where not generated
    reissued: int = 0           # turns issued again (a sync aborted them, or unverified weights sampled them)
    reprefilled: int = 0        # tokens the server prefilled again because the weights changed under a turn

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int32)
        self.loss_mask = np.asarray(self.loss_mask, dtype=np.uint8)
        self.logprobs = np.asarray(self.logprobs, dtype=np.float32)
        if self.versions is None:
            self.versions = np.where(self.loss_mask > 0, self.policy_version, -1)
        self.versions = np.asarray(self.versions, dtype=np.int32)
        if not (self.tokens.shape == self.loss_mask.shape == self.logprobs.shape == self.versions.shape) \
                or self.tokens.ndim != 1:
            raise ValueError(f"episode {self.attempt_key}: tokens, loss_mask, logprobs and versions must be 1-D "
                             "and equally long")

    @property
    def newest_version(self) -> int:
        gen = self.versions[self.versions >= 0]
        return int(gen.max()) if gen.size else self.policy_version

    @property
    def switches(self) -> int:
        """How often the version changes along the generated tokens (0: one version throughout)."""
        gen = self.versions[self.versions >= 0]
        return int((np.diff(gen) != 0).sum()) if gen.size else 0


def step_path(root: Path, step: int, suffix: str = "") -> Path:
    """`suffix` tells apart the files of several writers of one step (e.g. ".rank1")."""
    return Path(root) / f"step-{step:06d}{suffix}.h5"


def write_step(root: Path, step: int, episodes: list[Episode], policy_version: int = 0,
               compression: str = "gzip", suffix: str = "") -> Path:
    """Write one step's episodes atomically; returns the file path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = step_path(root, step, suffix)
    tmp = final.with_name(f".tmp-{final.name}")
    lengths = np.array([len(e.tokens) for e in episodes], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])
    opts = {"compression": compression, **({"compression_opts": 4} if compression == "gzip" else {}), "shuffle": True}

    def flat(name: str, dtype) -> np.ndarray:
        return np.concatenate([getattr(e, name) for e in episodes]).astype(dtype) if episodes else np.zeros(0, dtype)

    with h5py.File(tmp, "w") as f:
        f.attrs.update({"step": step, "policy_version": policy_version, "n_episodes": len(episodes), "n_tokens": total,
                        "created": datetime.now(timezone.utc).isoformat(), "layout": "tbhpc-rollout-v2"})
        chunks = (min(CHUNK, max(total, 1)),)
        for name, dtype in (("tokens", np.int32), ("loss_mask", np.uint8), ("logprobs", np.float32), ("versions", np.int32)):
            f.create_dataset(name, data=flat(name, dtype), chunks=chunks if total else None, **(opts if total else {}))
        f.create_dataset("offsets", data=offsets)
        g = f.create_group("episodes")
        for name, dtype in (("group", np.int32), ("reward", np.float32), ("advantage", np.float32), ("policy_version", np.int32),
                            ("newest_version", np.int32), ("switches", np.int32), ("reissued", np.int32),
                            ("reprefilled", np.int32)):
            g.create_dataset(name, data=np.array([getattr(e, name) for e in episodes], dtype=dtype))
        for name in ("task_id", "attempt_key", "finish_reason"):
            g.create_dataset(name, data=np.array([getattr(e, name) for e in episodes], dtype=object), dtype=STR)
    os.replace(tmp, final)
    return final


@dataclass
class MicroBatch:
    """Right-padded arrays [B, L] for the trainer; `advantages` is the episode's value on every token."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    advantages: np.ndarray
    attention_mask: np.ndarray
    episode_index: np.ndarray
    meta: dict = field(default_factory=dict)


def read_step(path: Path) -> list[Episode]:
    """Every episode of one step file, in order."""
    with h5py.File(path, "r") as f:
        offsets, g = f["offsets"][:], f["episodes"]
        tokens, mask, lps = f["tokens"][:], f["loss_mask"][:], f["logprobs"][:]
        versions = f["versions"][:] if "versions" in f else None      # layout v1: one version per episode
        cols = {k: g[k][:] for k in ("group", "reward", "advantage", "policy_version", "task_id", "attempt_key", "finish_reason")}
        counts = {k: g[k][:] if k in g else np.zeros(len(offsets) - 1, np.int32) for k in ("reissued", "reprefilled")}
    return [Episode(tokens[a:b], mask[a:b], lps[a:b], int(cols["group"][i]), float(cols["reward"][i]),
                    float(cols["advantage"][i]), cols["task_id"][i].decode(), cols["attempt_key"][i].decode(),
                    cols["finish_reason"][i].decode(), int(cols["policy_version"][i]),
                    None if versions is None else versions[a:b], int(counts["reissued"][i]), int(counts["reprefilled"][i]))
            for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:]))]


def read_episode(path: Path, i: int) -> Episode:
    return read_step(path)[i]


def iter_microbatches(path: Path, max_tokens: int, pad_id: int = 0, shuffle_seed: int | None = None) -> Iterator[MicroBatch]:
    """Pack episodes into micro-batches whose padded size B x L stays within `max_tokens`.
    An episode longer than `max_tokens` becomes a batch of its own (never truncated silently)."""
    with h5py.File(path, "r") as f:
        offsets = f["offsets"][:]
        lengths = np.diff(offsets)
        adv = f["episodes"]["advantage"][:]
        order = np.arange(len(lengths))
        if shuffle_seed is not None:
            np.random.default_rng(shuffle_seed).shuffle(order)
        batch: list[int] = []
        for i in order:
            longest = max([lengths[j] for j in batch] + [lengths[i]])
            if batch and longest * (len(batch) + 1) > max_tokens:
                yield _collate(f, offsets, adv, batch, pad_id)
                batch = []
            batch.append(int(i))
        if batch:
            yield _collate(f, offsets, adv, batch, pad_id)


def _collate(f, offsets: np.ndarray, adv: np.ndarray, idx: list[int], pad_id: int) -> MicroBatch:
    lengths = [int(offsets[i + 1] - offsets[i]) for i in idx]
    width = max(lengths)
    shape = (len(idx), width)
    ids = np.full(shape, pad_id, np.int32)
    mask, lp, att = np.zeros(shape, np.uint8), np.zeros(shape, np.float32), np.zeros(shape, np.uint8)
    advantages = np.zeros(shape, np.float32)
    for row, (i, n) in enumerate(zip(idx, lengths)):
        a = int(offsets[i])
        ids[row, :n] = f["tokens"][a:a + n]
        mask[row, :n] = f["loss_mask"][a:a + n]
        lp[row, :n] = f["logprobs"][a:a + n]
        att[row, :n] = 1
        advantages[row, :n] = adv[i]
    return MicroBatch(ids, mask, lp, advantages, att, np.array(idx))

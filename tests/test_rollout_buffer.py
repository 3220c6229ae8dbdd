"""HDF5 rollout buffers: exact round trip, packing into micro-batches, atomic step files."""
import h5py
import numpy as np
import pytest

from tbhpc.rollout.buffer import Episode, iter_microbatches, read_episode, step_path, write_step


def episodes(n=12, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(5, 300))
        mask = (rng.random(length) < 0.4).astype(np.uint8)
        out.append(Episode(rng.integers(0, 150_000, length), mask, np.where(mask, -rng.random(length), 0.0),
                           group=i // 4, reward=float(i % 2), advantage=float(i % 2) - 0.5, task_id=f"task-{i // 4}",
                           attempt_key=f"c/task-{i // 4}/{i % 4}/p", finish_reason="done", policy_version=7))
    return out


def test_round_trip_is_exact(tmp_path):
    eps = episodes()
    path = write_step(tmp_path, 3, eps, policy_version=7)
    assert path == step_path(tmp_path, 3) and not list(tmp_path.glob(".tmp-*"))
    with h5py.File(path) as f:
        assert f.attrs["n_episodes"] == 12 and f.attrs["n_tokens"] == sum(len(e.tokens) for e in eps)
        assert f["tokens"].compression == "gzip" and f["tokens"].dtype == np.int32
    for i, e in enumerate(eps):
        r = read_episode(path, i)
        assert np.array_equal(r.tokens, e.tokens) and np.array_equal(r.loss_mask, e.loss_mask)
        assert np.array_equal(r.logprobs, e.logprobs.astype(np.float32))
        assert (r.group, r.reward, r.advantage, r.task_id, r.attempt_key, r.finish_reason, r.policy_version) == \
               (e.group, e.reward, e.advantage, e.task_id, e.attempt_key, e.finish_reason, 7)


def test_microbatches_cover_every_episode_once_within_budget(tmp_path):
    eps = episodes(30, seed=1)
    path = write_step(tmp_path, 0, eps, compression="lzf")
    seen = []
    for mb in iter_microbatches(path, max_tokens=1024, shuffle_seed=5):
        b, width = mb.input_ids.shape
        assert b * width <= 1024 or b == 1
        for row, i in enumerate(mb.episode_index):
            n = len(eps[i].tokens)
            assert mb.attention_mask[row].sum() == n and np.array_equal(mb.input_ids[row, :n], eps[i].tokens)
            assert np.array_equal(mb.loss_mask[row, :n], eps[i].loss_mask) and not mb.loss_mask[row, n:].any()
            assert np.all(mb.advantages[row, :n] == np.float32(eps[i].advantage))
        seen += mb.episode_index.tolist()
    assert sorted(seen) == list(range(30))


def test_an_over_long_episode_is_its_own_batch_not_truncated(tmp_path):
    long = Episode(np.arange(5000), np.ones(5000), np.zeros(5000), group=0, reward=1.0)
    path = write_step(tmp_path, 1, [long] + episodes(3))
    batches = list(iter_microbatches(path, max_tokens=1000))
    assert batches[0].input_ids.shape == (1, 5000) and sum(len(b.episode_index) for b in batches) == 4


def test_bad_episodes_are_rejected():
    with pytest.raises(ValueError, match="equally long"):
        Episode([1, 2, 3], [1, 0], [0.0, 0.0, 0.0], group=0, reward=0.0)

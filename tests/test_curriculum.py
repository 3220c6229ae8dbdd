"""The curriculum's bookkeeping (train/curriculum.py), on hand-made groups: when it refreshes, which
tasks leave (the probe's Jeffreys bands on the trainer's own groups), which candidates join and in
what order, when a refresh takes effect, and that its checkpointed state continues exactly.
The trainer running it for real, stopped and resumed: tests/test_train_curriculum.py."""
import copy

import pytest

from tbhpc.train.curriculum import Curriculum, record_refresh

POOL = ["a", "b", "c", "d"]
CANDIDATES = [f"n{i}" for i in range(6)]


def _cur(**kw) -> Curriculum:
    args = dict(pool=POOL, candidates=CANDIDATES, seed=7, below=0.5, window=2, min_n=8)
    return Curriculum(**{**args, **kw})


def test_nothing_changes_while_the_mixed_share_holds_or_the_window_is_not_full():
    cur = _cur()
    assert cur.observe(1, [("a", 8, 8), ("b", 0, 8)], mixed=0, decided=2) is None     # one step: window of 2 not full
    assert cur.observe(2, [("c", 4, 8), ("d", 3, 8)], mixed=2, decided=2) is None     # 2 of 4 mixed: 0.5 is not below 0.5
    assert cur.pool_at(3) == POOL and cur.version == 0 and cur.version_at(3) == 0
    off = _cur(below=0.0)
    for step in range(1, 6):
        assert off.observe(step, [("a", 8, 8)], mixed=0, decided=1) is None           # below 0: never


def test_a_refresh_retires_tasks_outside_the_bands_and_admits_as_many_candidates():
    cur = _cur()
    cur.observe(1, [("a", 8, 8), ("b", 0, 8), ("c", 4, 8)], mixed=1, decided=3)
    rec = cur.observe(2, [("a", 8, 8), ("d", 8, 8)], mixed=0, decided=2)
    # a: 16/16 and b: 0/8 leave (too easy, too hard); c (4/8) stays; d (8/8, one group) is too easy too
    assert rec["retired"] == ["a", "b", "d"] and rec["mixed_share"] == 0.2 and rec["version"] == 1
    assert len(rec["admitted"]) == 3 and set(rec["admitted"]) <= set(CANDIDATES)
    assert cur.pool_at(3) == ["c", *rec["admitted"]] and cur.pool_at(2) == POOL      # from the next step on
    assert cur.version_at(3) == 1 and rec["from_step"] == 3
    assert cur.tallies == {"c": [[4, 8]]} and cur.shares == []      # what stays keeps its record, the window starts anew


def test_a_task_is_judged_on_its_last_groups_only():
    cur = _cur(window=1, below=0.6, min_n=16, memory=2)
    cur.observe(1, [("a", 4, 8)], mixed=1, decided=1)
    cur.observe(2, [("a", 8, 8), ("b", 3, 8)], mixed=1, decided=2)
    assert cur.tallies["a"] == [[4, 8], [8, 8]] and "a" in cur.current      # 12/16: easy, it stays
    rec = cur.observe(3, [("a", 8, 8)], mixed=0, decided=1)                  # the last two groups: 16/16
    assert cur.tallies.get("a") is None and "a" in rec["retired"] and "b" not in rec["retired"]   # b: 8 episodes < 16


def test_a_task_without_a_group_of_evidence_is_not_judged():
    cur = _cur(window=1)
    rec = cur.observe(1, [("a", 4, 4), ("b", 8, 8)], mixed=0, decided=2)            # a: 4 episodes < min_n 8
    assert rec["retired"] == ["b"] and "a" in cur.current


def test_candidates_come_in_a_seeded_order_and_a_new_cycle_reprobes_retired_ones():
    orders = []
    for seed in (7, 7, 8):
        cur = _cur(seed=seed, window=1, size=2)
        got = []
        for step in range(1, 5):
            rec = cur.observe(step, [(t, 8, 8) for t in cur.current], mixed=0, decided=len(cur.current))
            got.append(rec["admitted"])
        orders.append(got)
    assert orders[0] == orders[1] and orders[0] != orders[2]                       # a function of the seed
    flat = [t for adm in orders[0] for t in adm]
    assert sorted(flat[:6]) == sorted(CANDIDATES)                                   # the first cycle: each candidate once
    assert set(flat[6:]) <= set(CANDIDATES)                                         # then retired ones come back


def test_nothing_left_keeps_the_pool_and_says_so():
    cur = _cur(candidates=[], window=1)
    rec = cur.observe(1, [(t, 8, 8) for t in POOL], mixed=0, decided=4)
    assert rec["admitted"] == [] and cur.current == POOL and "no candidate is left" in rec["note"]
    only_reband = _cur(candidates=[], window=1, below=0.6)
    rec = only_reband.observe(1, [("a", 8, 8), ("b", 3, 8)], mixed=1, decided=2)
    assert only_reband.current == ["b", "c", "d"] and rec["admitted"] == []        # re-band only: the pool shrinks


def test_one_step_off_policy_a_refresh_waits_for_the_step_already_drawn():
    cur = _cur(window=1, lag=1)
    rec = cur.observe(4, [("a", 8, 8)], mixed=0, decided=1)
    assert rec["from_step"] == 6 and cur.pool_at(5) == POOL and cur.pool_at(6) != POOL


def test_the_checkpointed_state_continues_exactly_like_the_uninterrupted_run():
    steps = {s: [(t, (s * 3 + i) % 9, 8) for i, t in enumerate(POOL + CANDIDATES)] for s in range(1, 13)}

    def run(cur: Curriculum, first: int, last: int) -> list:
        out = []
        for s in range(first, last + 1):
            pool = cur.pool_at(s)
            groups = [g for g in steps[s] if g[0] in pool]
            rec = cur.observe(s, groups, mixed=sum(0 < k < n for _, k, n in groups), decided=len(groups))
            out.append((s, tuple(pool), rec and (rec["retired"], rec["admitted"])))
        return out

    whole = run(_cur(window=2, below=0.9), 1, 12)
    assert any(r[2] for r in whole)                                                 # it did refresh
    first = _cur(window=2, below=0.9)
    head = run(first, 1, 5)
    resumed = _cur(window=2, below=0.9)
    resumed.restore(copy.deepcopy(first.state()))
    assert head + run(resumed, 6, 12) == whole
    again = _cur(window=2, below=0.9)
    again.restore(first.state())
    assert again.state() == first.state()


def test_a_refresh_is_logged_in_the_run(tmp_path):
    line = record_refresh(tmp_path, {"step": 3, "from_step": 4, "version": 1, "mixed_share": 0.1, "retired": ["a"],
                                     "admitted": ["n1"], "pool": 4})
    assert "1 task(s) left their band, 1 candidate(s) joined: pool version 1 (4 tasks) from step 4" in line
    assert (tmp_path / "logs" / "curriculum.jsonl").read_text().count("\n") == 1


@pytest.mark.parametrize("field, value, words", [("refresh_below", 1.5, "'refresh_below' must be within [0, 1]"),
                                                  ("refresh_window", 0, "'refresh_window' (>= 1)"),
                                                  ("refresh_pool", "x.yaml", "'refresh_pool' needs refresh_below > 0")])
def test_the_config_refuses_bad_curriculum_fields(field, value, words):
    from tbhpc.errors import UserError
    from tbhpc.train.config import TrainConfig
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**{field: value})

"""One rank's rollouts for a step (tbhpc/train/rollouts.py) with the real warm-started model in
process: zero-variance groups are replaced until B mixed ones exist in draw order, system errors
are re-run and counted, a group that cannot be completed is dropped and never scored, a step
stopped by a signal is left undecided and redrawn identically.

The generator is wrapped to fail on chosen calls: an endpoint that breaks is what this tests,
and a real one cannot be made to break on cue. Everything else is real (model, episodes, grading).
"""
import itertools
import threading

import pytest

from tbhpc.errors import EndpointError
from tbhpc.policy.generation import LocalGenerator
from tbhpc.policy.tokens import TokenPolicy
from tbhpc.train.queue import DROPPED, FLAT, MIXED, DrawQueue, make_store
from tbhpc.train.rollouts import SURPLUS, RolloutContext, run_rank_rollouts

pytestmark = pytest.mark.slow
POOL = ["consulting-leave_balance-001", "consulting-leave_balance-002"]


class Breaking:
    """Raises EndpointError on calls whose (first-try) seed `fail(seed)` picks."""

    def __init__(self, inner, fail):
        self.inner, self.fail, self.calls, self.failures = inner, fail, itertools.count(), 0
        self.lock = threading.Lock()

    def generate(self, prompt_ids, sampling, seed):
        if self.fail(seed):
            with self.lock:
                self.failures += 1
            raise EndpointError("injected: the endpoint dropped the request")
        return self.inner.generate(prompt_ids, sampling, seed)


@pytest.fixture(scope="module")
def engine(warm_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(warm_dir)
    model = AutoModelForCausalLM.from_pretrained(warm_dir, dtype=torch.float32).eval()
    return tok, LocalGenerator.for_tokenizer(model, tok)


def _ctx(engine, tasks_by_id, fail=lambda seed: False, max_reruns=2):
    from tbhpc.domains import get_domain
    from tbhpc.env.judge import KeywordJudge
    from tbhpc.env.users import ScriptedUser
    tok, gen = engine
    policy = TokenPolicy(generator="local", max_tokens=48, response_budget=160)
    broken = Breaking(gen, fail)
    policy.use(tok, broken)
    ctx = RolloutContext(POOL, {i: tasks_by_id[i] for i in POOL}, lambda t: get_domain(t.domain), policy, ScriptedUser(), KeywordJudge(),
                         group_size=4, seed=5, max_reruns=max_reruns, episodes_in_flight=8)
    return ctx, broken


def _check_structure(outcomes, cutoff, need):
    kept = [g for g in outcomes if g.index <= cutoff and g.status == MIXED]
    assert len(kept) == need or cutoff == 11            # B mixed groups, or the cap was reached
    for g in outcomes:
        if g.status in (MIXED, FLAT):
            rewards = [r.episode.reward for r in g.rollouts]
            assert len(rewards) == 4 and set(rewards) <= {0.0, 1.0}
            assert (len(set(rewards)) > 1) == (g.status == MIXED)
        if g.index > cutoff:
            assert g.status in (SURPLUS, MIXED, FLAT, DROPPED)     # finished past the cutoff: never trained on
    return kept


def test_flat_groups_are_replaced_until_b_mixed_groups_exist(engine, tasks_by_id):
    ctx, _ = _ctx(engine, tasks_by_id)
    queue = DrawQueue(make_store(0, 1), step=1, need=2, cap=12)
    outcomes = run_rank_rollouts(ctx, queue, step=1, expected_version=0)
    cutoff = queue.cutoff()
    kept = _check_structure(outcomes, cutoff, 2)
    drawn = [g for g in outcomes if g.index <= cutoff]
    assert sorted(g.index for g in drawn) == list(range(cutoff + 1))   # every draw up to the cutoff ran, in order
    assert kept and all(g.reruns == 0 for g in outcomes)


def test_system_errors_are_rerun_and_never_scored(engine, tasks_by_id):
    """Every first try of attempts whose seed is even fails: each is re-run with a fresh sample in
    the same slot, counted, and the group completes with real rewards."""
    seen, lock = set(), threading.Lock()

    def first_try_of_even_episodes(seed):          # TokenSession seeds a turn with episode_seed * 1009 + turn
        episode = seed // 1009
        with lock:
            if episode % 2 or episode in seen:
                return False
            seen.update({episode, episode + 1_000_000})   # the re-run's fresh sample (collect_episode) goes through
            return True

    ctx, broken = _ctx(engine, tasks_by_id, fail=first_try_of_even_episodes)
    queue = DrawQueue(make_store(0, 1), step=1, need=2, cap=12)
    outcomes = run_rank_rollouts(ctx, queue, step=1, expected_version=0)
    assert broken.failures > 0
    done = [g for g in outcomes if g.status in (MIXED, FLAT)]
    assert done and sum(g.reruns for g in outcomes) > 0
    assert all(r.result.status == "ok" for g in done for r in g.rollouts)
    _check_structure(outcomes, queue.cutoff(), 2)


def test_a_group_that_cannot_be_completed_is_dropped(engine, tasks_by_id):
    """An endpoint that never answers: every group is dropped with its cause, none is scored,
    and the step ends at its cap instead of hanging."""
    ctx, broken = _ctx(engine, tasks_by_id, fail=lambda seed: True, max_reruns=1)
    queue = DrawQueue(make_store(0, 1), step=1, need=2, cap=3)
    outcomes = run_rank_rollouts(ctx, queue, step=1, expected_version=0)
    assert [g.status for g in outcomes] == [DROPPED] * 3 and queue.cutoff() == 2
    assert all(not g.rollouts and "system errors in a row" in g.error for g in outcomes)


def test_samples_from_older_weights_than_the_step_expects_are_not_trained_on(engine, tasks_by_id):
    ctx, _ = _ctx(engine, tasks_by_id)
    queue = DrawQueue(make_store(0, 1), step=3, need=1, cap=2)
    outcomes = run_rank_rollouts(ctx, queue, step=3, expected_version=2)    # the generator still says "base"
    assert [g.status for g in outcomes] == [DROPPED, DROPPED]
    assert all("expected step 2" in g.error for g in outcomes)


def test_under_max_staleness_1_one_version_behind_is_trained_on_and_two_are_refused(engine, tasks_by_id):
    """One step off-policy: step 2's rollouts from the base weights (one version behind) are kept;
    step 3's from them (two behind) are dropped with the bound in the error, never scored."""
    ctx, _ = _ctx(engine, tasks_by_id)
    ctx.max_staleness = 1
    queue = DrawQueue(make_store(0, 1), step=2, need=1, cap=4)
    kept = run_rank_rollouts(ctx, queue, step=2, expected_version=1)      # the generator says "base"
    assert queue.cutoff() is not None and all(g.status in (MIXED, FLAT) for g in kept)
    assert {r.episode.policy_version for g in kept for r in g.rollouts} == {0}
    queue = DrawQueue(make_store(0, 1), step=3, need=1, cap=2)
    refused = run_rank_rollouts(ctx, queue, step=3, expected_version=2)
    assert [g.status for g in refused] == [DROPPED, DROPPED]
    assert all("expected step 2 (staleness bound 1)" in g.error for g in refused)


def test_a_step_stopped_mid_rollouts_is_abandoned_and_redrawn_identically(engine, tasks_by_id):
    """A preemption signal during the rollouts (the trainer's stop event, set here when the 6th
    episode starts, with groups 0 and 1 in flight): episodes already begun finish, none begins after
    it (a group cut short is surplus), no further group is claimed, the
    queue is aborted for every other rank and the step stays undecided, so the trainer records
    nothing of it. The step drawn again from a fresh queue -- what the requeued job does -- gives
    what an uninterrupted step gives (which needs three draws or more)."""
    def outcome(groups, cutoff=None):
        return [(g.index, g.task_id, g.status, [r.episode.reward for r in g.rollouts])
                for g in groups if cutoff is None or g.index <= cutoff]

    ctx, _ = _ctx(engine, tasks_by_id)
    queue = DrawQueue(make_store(0, 1), step=1, need=2, cap=12)
    reference = outcome(run_rank_rollouts(ctx, queue, step=1, expected_version=0), queue.cutoff())
    # draws in order, and more than the two in flight when the stop comes (how many more depends on
    # the model's samples on this CPU: 0-2 here, 0-3 on a CI machine)
    assert [g[0] for g in reference] == list(range(len(reference))) and len(reference) >= 3, reference

    stop, started, lock = threading.Event(), set(), threading.Lock()

    def signal_when_the_sixth_episode_starts(seed):
        with lock:
            started.add(seed // 1009)              # TokenSession seeds a turn with episode_seed * 1009 + turn
            if len(started) == 6:
                stop.set()
        return False

    ctx, _ = _ctx(engine, tasks_by_id, fail=signal_when_the_sixth_episode_starts)
    queue = DrawQueue(make_store(0, 1), step=1, need=2, cap=12)
    abandoned = run_rank_rollouts(ctx, queue, step=1, expected_version=0, stop=stop)
    assert stop.is_set() and queue.aborted() and queue.claim() is None
    # draw 2 never started; each group in flight either finished exactly as uninterrupted or, when
    # some of its episodes had not begun at the stop (thread timing), was cut short: surplus, unscored
    assert [g.index for g in abandoned] == [0, 1]
    for got, want in zip(outcome(abandoned), reference[:2]):
        assert got == want or (got[2] == SURPLUS and got[3] == []), (got, want)
    assert queue.cutoff() is None                       # undecided: the trainer raises Preempted here

    queue = DrawQueue(make_store(0, 1), step=1, need=2, cap=12)     # the requeued job's fresh queue
    assert outcome(run_rank_rollouts(ctx, queue, step=1, expected_version=0), queue.cutoff()) == reference

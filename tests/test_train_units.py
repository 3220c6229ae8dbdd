"""The trainer's pieces that need no process group: the pool guard and seeded draws, the
draw-order decision of the shared queue, packing, configs and rendered scripts."""
import dataclasses
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tbhpc.config import load_config
from tbhpc.errors import UserError
from tbhpc.launch.train import render_train, render_train_pipeline
from tbhpc.rollout.buffer import Episode
from tbhpc.train.config import TrainConfig
from tbhpc.train.draw import draw, episode_seed, load_pool
from tbhpc.train.engine import DistEnv, ds_config
from tbhpc.train.logprobs import token_logprobs
from tbhpc.train.packing import bins, pack
from tbhpc.train.queue import DROPPED, FLAT, MIXED, DrawQueue, decide, make_store
from tbhpc.train.record import step_line


def test_a_pool_holding_a_held_out_id_is_refused(tmp_path):
    pool = tmp_path / "pool.yaml"
    pool.write_text("tasks: [a-1, b-2, c-3]\n")
    excl = tmp_path / "eval_ids.txt"
    excl.write_text("# held out\nz-9\nb-2\n")
    with pytest.raises(UserError, match=r"pool.yaml: 1 task\(s\) of the exclusion list .*eval_ids.txt.*'b-2'"):
        load_pool(pool, [str(excl)])
    excl.write_text("z-9\n")
    assert load_pool(pool, [str(excl)]) == ["a-1", "b-2", "c-3"]
    (tmp_path / "empty.yaml").write_text("tasks: []\n")
    with pytest.raises(UserError, match="empty"):
        load_pool(tmp_path / "empty.yaml")


def test_draws_are_a_function_of_seed_and_step_and_cycle_the_pool():
    pool = [f"t{i}" for i in range(7)]
    first = [draw(pool, 0, 3, i) for i in range(14)]
    assert first == [draw(pool, 0, 3, i) for i in range(14)]            # a restart redraws the same
    assert sorted(first[:7]) == pool and sorted(first[7:]) == pool      # each cycle is a permutation
    assert first[:7] != [draw(pool, 0, 4, i) for i in range(7)]         # another step, another order
    assert first[:7] != [draw(pool, 1, 3, i) for i in range(7)]         # another seed too
    assert episode_seed(0, 3, 5) == episode_seed(0, 3, 5) != episode_seed(0, 3, 6)


def test_the_cutoff_is_the_bth_mixed_group_in_draw_order():
    assert decide([MIXED, FLAT, MIXED, MIXED], need=2, cap=10) == 2
    assert decide([MIXED, None, MIXED, MIXED], need=2, cap=10) is None   # draw 1 still running: wait for it
    assert decide([MIXED, DROPPED, FLAT, MIXED], need=2, cap=10) == 3     # dropped groups count as nothing
    assert decide([FLAT, FLAT, FLAT], need=2, cap=3) == 2                 # cap reached: train on what exists
    assert decide([FLAT, FLAT], need=2, cap=3) is None


def test_a_bound_on_draws_ahead_keeps_the_same_groups_and_claims_fewer():
    """Eight workers, B = 3, at most one group ahead: at most B + 1 groups are ever in flight, a
    flat group's slot is claimed again, the cutoff is the unbounded queue's, and fewer draws run."""
    import time
    status = [FLAT, MIXED, FLAT, FLAT, MIXED, MIXED, FLAT, MIXED] + [MIXED] * 20
    delays = 0.01 + np.random.default_rng(0).random(28) * 0.02    # >= 10 ms: every worker claims before the first reports

    def run(ahead):
        q = DrawQueue(make_store(0, 1), step=1, need=3, cap=28, ahead=ahead)
        claimed, in_flight, peak, lock = [], set(), [0], threading.Lock()

        def worker():
            while (i := q.claim()) is not None:
                with lock:
                    claimed.append(i)
                    in_flight.add(i)
                    peak[0] = max(peak[0], len(in_flight))
                time.sleep(delays[i])
                with lock:
                    in_flight.discard(i)
                if q.surplus(i):
                    q.release(i)
                else:
                    q.report(i, status[i])
                q.cutoff()
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return q.cutoff(), sorted(claimed), peak[0]

    cut_free, claimed_free, peak_free = run(None)
    cut, claimed, peak = run(1)
    assert cut == cut_free == 5
    assert claimed[:cut + 1] == list(range(cut + 1))             # every draw up to the cutoff ran
    assert peak <= 3 + 1 < peak_free == 8
    assert len(claimed) < len(claimed_free)
    with pytest.raises(UserError, match="draw_ahead"):
        TrainConfig(model="m", pool="p", draw_ahead=-2)


def test_the_queue_decides_the_same_groups_whatever_finishes_first():
    """Eight workers on two 'ranks' (one store) finish draws in a scrambled order; the decided
    cutoff is the draw-order one, and nobody claims far past it."""
    status = [FLAT, MIXED, FLAT, FLAT, MIXED, MIXED, FLAT, MIXED] + [MIXED] * 20
    store = make_store(0, 1)
    queues = [DrawQueue(store, step=1, need=3, cap=28) for _ in range(2)]
    claimed = []
    rng = np.random.default_rng(0)
    delays = rng.random(28) * 0.02

    def worker(q):
        import time
        while (i := q.claim()) is not None:
            claimed.append(i)
            time.sleep(delays[i])
            q.report(i, status[i])
            q.cutoff()

    threads = [threading.Thread(target=worker, args=(queues[k % 2],)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert queues[0].cutoff() == queues[1].cutoff() == 5
    assert max(claimed) <= 5 + 8              # no claims once 3 mixed groups are known (at most one per worker before)
    assert not queues[0].surplus(5) and queues[0].surplus(6)
    q = DrawQueue(store, step=2, need=3, cap=28)
    q.abort()
    assert q.claim() is None                  # a signal on one rank stops every rank's claims


def test_bins_are_first_fit_decreasing_and_never_split_an_episode():
    assert bins([5, 30, 10, 12, 3], 32) == [[1], [0, 2, 3, 4]]
    b = bins([100, 10, 10], 32)
    assert [0] in b and sorted(i for x in b for i in x) == [0, 1, 2]


def test_packed_logprobs_equal_one_episode_at_a_time(tiny_dir):
    """Episodes laid end to end with restarting positions: no episode sees its neighbour."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    rng = np.random.default_rng(1)
    eps = []
    for n in (17, 40, 5, 23):
        mask = (rng.random(n) < 0.5).astype(np.uint8)
        eps.append(Episode(rng.integers(0, model.config.vocab_size, n), mask, np.zeros(n), 0, 0.0))
    packs = pack(eps, [0.5, -1.0, 0.25, 0.0], budget=100)
    assert len(packs) == 1 and packs[0].n_tokens == 85
    mb = packs[0]
    packed = token_logprobs(model, mb)
    singles = {p.episodes[0]: token_logprobs(model, p) for p in pack(eps, [0.0] * 4, budget=1)}   # one episode per pass
    pos = 0
    for i in mb.episodes:
        n = len(eps[i].tokens)
        # packed entry j scores token j+1: this episode's targets are entries pos .. pos+n-2
        torch.testing.assert_close(packed[pos:pos + n - 1], singles[i], atol=1e-5, rtol=1e-5)
        pos += n
    # loss mask: never a row's or an episode's first token; advantages broadcast per episode
    assert mb.loss_mask.sum().item() == mb.n_loss_tokens
    assert set(mb.advantages.tolist()) <= {0.5, -1.0, 0.25, 0.0}


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(UserError, match="'group_size' must be >= 2"):
        TrainConfig(group_size=1)
    with pytest.raises(UserError, match="'generator' must be server, local or batched"):
        TrainConfig(generator="ray")
    with pytest.raises(UserError, match="'loss_agg' must be one of token-mean, seq-mean-token-mean"):
        TrainConfig(loss_agg="sum")
    bad = tmp_path / "t.yaml"
    bad.write_text("lr: fast\n")
    with pytest.raises(UserError, match=r"t.yaml: field 'lr': expected float"):
        load_config(TrainConfig, bad)
    assert load_config(TrainConfig, None, ["lr=1e-6"]).lr == 1e-6      # YAML reads 1e-6 as text; taken as a number
    with pytest.raises(UserError, match="'model' is required"):
        TrainConfig(pool="p").validate()
    with pytest.raises(UserError, match="'max_staleness' must be >= 0 .0: on-policy"):
        TrainConfig(max_staleness=-1)
    with pytest.raises(UserError, match="'tis_cap' must be 0 .off., a number >= 1, or unset .2 from max_staleness 2., "
                                        "got 0.5"):
        TrainConfig(tis_cap=0.5)
    with pytest.raises(UserError, match="'keep_published' must be >= 4 with max_staleness 3"):
        TrainConfig(max_staleness=3, keep_published=3)
    with pytest.raises(UserError, match="'keep_published' must be >= 2 with max_staleness 1"):
        TrainConfig(max_staleness=1, keep_published=1)


def test_deepspeed_config_follows_the_device():
    cpu = ds_config(TrainConfig(), gpu=False, hidden=64)
    gpu = ds_config(TrainConfig(zero_stage=2), gpu=True, hidden=64)
    assert cpu["bf16"]["enabled"] is False and gpu["bf16"]["enabled"] is True
    assert cpu["zero_optimization"]["stage"] == 3 and gpu["zero_optimization"]["stage"] == 2
    assert cpu["optimizer"]["params"] == {"lr": 1e-6, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8,
                                          "torch_adam": True}
    assert cpu["gradient_clipping"] == 1.0 and cpu["gradient_accumulation_steps"] == 1
    # on a GPU torch's fused AdamW (DeepSpeed's FusedAdam would be compiled with nvcc on every node)
    assert gpu["optimizer"]["params"]["torch_adam"] is True and gpu["optimizer"]["params"]["fused"] is True
    offload = ds_config(TrainConfig(offload_optimizer=True), gpu=True, hidden=64)["optimizer"]["params"]
    assert offload["torch_adam"] is False and "fused" not in offload       # DeepSpeed's CPU Adam on host memory


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_gradients_are_accumulated_and_reduced_in_fp32(stage):
    """DeepSpeed follows the model's dtype for both unless told (its pair check refuses fp32 accumulation
    without ZeRO, so stage 0 gets the fp32 reduction only); fp32 runs need neither key."""
    bf16 = ds_config(TrainConfig(dtype="bf16", zero_stage=stage), gpu=True, hidden=64)
    assert bf16["communication_data_type"] == "fp32"
    assert bf16.get("data_types") == ({"grad_accum_dtype": "fp32"} if stage else None)
    fp32 = ds_config(TrainConfig(dtype="fp32", zero_stage=stage), gpu=False, hidden=64)
    assert "data_types" not in fp32 and "communication_data_type" not in fp32


def test_a_flash_attn_that_is_found_but_does_not_import_means_sdpa(tmp_path, monkeypatch):
    """A wheel built for another torch: found by find_spec, fails on import (undefined symbols)."""
    from tbhpc.train.dsconfig import attention_kernel, flash_attn_state
    pkg = tmp_path / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c10')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    assert flash_attn_state() == (False, "ImportError: flash_attn_2_cuda.so: undefined symbol: _ZN3c10")
    assert attention_kernel(gpu=True) == "sdpa"
    (pkg / "__init__.py").write_text("")             # one that imports
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    assert attention_kernel(gpu=True) == "flash_attention_2" and attention_kernel(gpu=False) == "sdpa"


def test_ranks_come_from_slurm_or_torchrun():
    s = DistEnv.from_environ({"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0",
                              "MASTER_ADDR": "node1", "MASTER_PORT": "23456"})
    assert (s.rank, s.world, s.local_rank, s.master_addr, s.master_port) == (2, 3, 0, "node1", 23456)
    t = DistEnv.from_environ({"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert (t.rank, t.world, t.local_rank) == (1, 8, 1)     # torchrun inside an allocation wins
    assert DistEnv.from_environ({}).world == 1


def test_the_trainer_s_ports_stay_below_the_ephemeral_range():
    """Debian hands out 32768-60999 to outgoing connections (NCCL's, gloo's, HTTP clients'): a rendezvous
    port in that range may be taken on rank 0's node and the job dies at start with EADDRINUSE."""
    import re
    text = render_train("/r", "/r/t.yaml", TrainConfig(model="m", pool="p"), "/w")
    base, step, mod = map(int, re.search(r"MASTER_PORT=\$\(\((\d+) \+ (\d+) \* \(SLURM_JOB_ID % (\d+)\)\)\)", text).groups())
    ports = [base + step * (job % mod) + k for job in range(0, 10 * mod, 7) for k in (0, 1)]
    assert min(ports) >= 20000 and max(ports) < 32768


def test_trainer_script_asks_for_nodes_and_ranks(tmp_path):
    cfg = TrainConfig(model="m", pool="p", nodes=3, gpus_per_node=8, serve_config="jobs/serve.yaml",
                      serve={"device": "cuda", "tensor_parallel_size": 4, "data_parallel_size": 2})
    text = render_train("/runs/r", "/runs/r/train.yaml", cfg, "/work", serve_job="1234")
    for line in ("#SBATCH --dependency=after:1234", "#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=8",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --requeue", "#SBATCH --signal=USR2@120",
                 "export MASTER_PORT=$((20000 + 2 * (SLURM_JOB_ID % 6383)))",
                 "srun --kill-on-bad-exit=1 "):
        assert line in text, line
    assert "tbhpc.cli train /runs/r --config /runs/r/train.yaml" in text
    scripts = render_train_pipeline("/runs/r", cfg, "/work")
    assert list(scripts) == ["serve.sbatch", "train.sbatch"] and "--gres=gpu:8" in scripts["serve.sbatch"]
    local = render_train_pipeline("/runs/r", TrainConfig(model="m", pool="p", generator="local"), "/work")
    assert list(local) == ["train.sbatch"] and "--dependency" not in local["train.sbatch"]


def test_step_line_reads_like_a_log():
    row = {"step": 3, "policy_version": "step-000002", "reward_mean": 0.25, "kept": 3, "flat": 1, "drawn": 5,
           "dropped": 1, "reruns": 2, "tokens": 1000, "loss": -0.01, "grad_norm": 0.5, "clip_fraction": 0.0,
           "mismatch": 1e-3, "rollout_s": 1.0, "update_s": 2.0, "publish_s": 0.1, "sync_s": 0.2}
    line = step_line(row)
    assert line.startswith("step    3 [step-000002] reward 0.250 mixed 3/4 (drawn 5, dropped 1, re-runs 2)")
    assert "update 2.0s" in line and "sync 0.2s" in line and "wait" not in line
    line = step_line({**row, "max_staleness": 1, "staleness": 1, "wait_s": 0.4})      # one step off-policy: the trainer's wait shows
    assert line.endswith("sync 0.2s wait 0.4s (staleness 1)")
    line = step_line({**row, "max_staleness": 2, "staleness": 2, "wait_s": 0.4, "staleness_tokens": [50, 30, 20],
                      "truncated": 0.031, "reissued": 2})          # k >= 2: the loss tokens' ages and the truncation
    assert line.endswith("(staleness 2) | age 0:50% 1:30% 2:20% trunc 0.031 reissued 2")


def test_warmstart_examples_are_the_token_traces_of_passed_oracle_episodes(tiny_dir, tasks_by_id):
    """SFT data is built like rollouts: prompt tokens masked, the oracle's turns as if generated
    (end-of-turn included); with ask=True the first turn asks the user for the facts it needs."""
    from transformers import AutoTokenizer
    from tbhpc.train.sft import oracle_examples
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    task = tasks_by_id["retail-order_status-001"]
    plain, = oracle_examples(tok, [task])
    asking, = oracle_examples(tok, [task], ask=True)
    said = tok.decode([t for t, m in zip(asking.tokens, asking.loss_mask) if m])
    assert said.startswith("To help you, could you tell me your email?<|im_end|><tool_call>")
    assert said.count("<|im_end|>") == tok.decode([t for t, m in zip(plain.tokens, plain.loss_mask) if m]).count("<|im_end|>") + 1
    assert plain.reward == asking.reward == 1.0 and asking.loss_mask[0] == 0


def test_warmstart_phase_schedules():
    """A phase warms up linearly, then decays linearly to 5% over `decay` steps (a phase cut short
    stops part-way down); without decay the rate stays at its peak. The demo recipe's phases are
    the ones that made models/demo-warm: windows first, then whole episodes."""
    from tbhpc.train.sft import RECIPES, Phase
    cut = Phase(750, 1e-3, warmup=30, decay=1000)
    assert cut.factor(0) == 1 / 30 and abs(cut.factor(29) - 0.971) < 1e-12     # decay runs from step 0
    assert abs(cut.factor(500) - 0.5) < 1e-12 and abs(cut.factor(749) - 0.251) < 1e-12
    assert Phase(100, 1e-3, decay=100).factor(99) == 0.05 and Phase(10, 1e-3).factor(9) == 1.0
    phases = RECIPES["demo"]["phases"]
    assert phases[0].window > 0 and all(p.window == 0 for p in phases[1:])


@pytest.mark.parametrize("local_rank, visible, local_world, cuda_visible, want", [
    (5, 8, 8, "0,1,2,3,4,5,6,7", 5),     # --gpus-per-node=8: every task sees the node's 8
    (5, 1, 8, "5", 0),                   # --gpus-per-task=1 / --gpu-bind: each task its own
    (0, 1, None, None, 0),               # a one-GPU node
    (3, 4, None, "0,1,2,3", 3),          # torchrun on 4 GPUs, no Slurm task count
])
def test_each_rank_finds_its_gpu_however_slurm_binds_them(local_rank, visible, local_world, cuda_visible, want):
    from tbhpc.train.dist import cuda_device
    assert cuda_device(local_rank, visible, local_world, cuda_visible) == want


@pytest.mark.parametrize("local_rank, visible, local_world", [(3, 2, 4), (0, 0, 1), (4, 4, None)])
def test_a_binding_no_rank_can_use_is_one_line(local_rank, visible, local_world):
    from tbhpc.errors import UserError
    from tbhpc.train.dist import cuda_device
    with pytest.raises(UserError) as err:
        cuda_device(local_rank, visible, local_world, "0,1")
    assert "\n" not in str(err.value) and f"local rank {local_rank}" in str(err.value)


@pytest.mark.parametrize("slurm, want_device", [
    ({"SLURM_LOCALID": "3", "SLURM_NTASKS_PER_NODE": "8", "CUDA_VISIBLE_DEVICES": "3"}, 0),   # --gpus-per-task=1
    ({"SLURM_LOCALID": "3", "SLURM_NTASKS_PER_NODE": "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 3),
])
def test_deepspeed_drives_the_gpu_tbhpc_chose(slurm, want_device):
    """DeepSpeed's engine and zero.Init take their device from LOCAL_RANK: with one GPU bound per task
    it must be 0 on every task, not SLURM_LOCALID (device 3 of 1 visible: invalid device ordinal)."""
    from tbhpc.train.dist import bind_gpu
    environ = {"SLURM_PROCID": "11", "SLURM_NTASKS": "24", "MASTER_ADDR": "n1", "MASTER_PORT": "23456", **slurm}
    env = DistEnv.from_environ(environ)
    visible = len(slurm["CUDA_VISIBLE_DEVICES"].split(","))
    assert bind_gpu(env, visible, environ) == want_device
    assert environ["LOCAL_RANK"] == str(want_device) and environ["RANK"] == "11" and environ["WORLD_SIZE"] == "24"
    assert env.local_rank == 3 and environ["SLURM_LOCALID"] == "3"      # the node-local place is kept


def test_local_world_comes_from_torchrun_or_slurm():
    from tbhpc.train.dist import local_world_size
    assert local_world_size({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert local_world_size({"SLURM_NTASKS_PER_NODE": "8"}) == 8
    assert local_world_size({"SLURM_TASKS_PER_NODE": "8(x3)"}) is None


def test_trainer_and_vllm_get_one_nccl_cumem_setting():
    """vLLM sets NCCL_CUMEM_ENABLE=0 on import unless told; the trainer's torch would keep NCCL's 1; the
    broadcast joins both in one communicator. On GPUs both scripts export one value, the config's if it has one."""
    import re
    def values(**kw):
        scripts = render_train_pipeline("/r", TrainConfig(model="m", pool="p", serve={"device": "cuda"}, **kw), "/w")
        return [re.findall(r"^export NCCL_CUMEM_ENABLE=(\S+)$", t, re.M) for t in scripts.values()]
    assert values(gpus_per_node=8) == [["0"], ["0"]]
    assert values(gpus_per_node=8, env={"NCCL_CUMEM_ENABLE": "1"}) == [["1"], ["1"]]
    assert values(gpus_per_node=0) == [[], []]


def test_config_env_is_exported_in_both_scripts_and_refused_when_it_cannot_be():
    from tbhpc.errors import UserError
    cfg = TrainConfig(model="m", pool="p", nodes=3, gpus_per_node=8, serve={"device": "cuda"},
                      env={"NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_SOCKET_IFNAME": "ib0", "WEIRD": "a b'c"})
    scripts = render_train_pipeline("/runs/r", cfg, "/work")
    for name in ("serve.sbatch", "train.sbatch"):
        assert "export NCCL_IB_HCA=mlx5_0,mlx5_1\nexport NCCL_SOCKET_IFNAME=ib0\n" in scripts[name], name
        assert "export WEIRD='a b'\"'\"'c'" in scripts[name]
    for bad in ({"1X": "a"}, {"X": "a\nb"}, {"X": [1]}):
        with pytest.raises(UserError, match="field 'env'"):
            TrainConfig(model="m", pool="p", env=bad)


def test_episodes_in_flight_is_the_runs_total_and_requests_time_out_by_a_decode_floor(tiny_dir):
    from tbhpc.errors import UserError
    from tbhpc.policy.tokens import TokenPolicy
    cfg = TrainConfig(model="m", pool="p", episodes_in_flight=144, group_size=8, max_tokens=8192,
                      request_floor_tokens_per_s=5)
    assert [cfg.in_flight_per_rank(n) for n in (1, 3, 24, 200)] == [144, 48, 6, 1]
    assert cfg.request_timeout_s == pytest.approx(8192 / 5 + 60)
    with pytest.raises(UserError, match="request_floor_tokens_per_s"):
        TrainConfig(model="m", pool="p", request_floor_tokens_per_s=0)
    policy = TokenPolicy(model_path=str(tiny_dir), generator="server", base_url="http://127.0.0.1:9", timeout_s=1698.4)
    assert policy.load()[1].timeout_s == 1698.4      # what the trainer's policy hands its server generator
    with pytest.raises(UserError, match="timeout_s"):
        TokenPolicy.check_ranges({"generator": "server", "base_url": "http://x", "timeout_s": -1})


def test_the_preemption_margin_is_checked_against_the_measured_step():
    from tbhpc.train.jobs import preemption_margin
    assert preemption_margin(300, update_s=60, publish_s=100) == ""
    warn = preemption_margin(120, update_s=60, publish_s=100)
    assert "120 s before the time limit" in warn and "(160 s)" in warn and "slurm.signal_seconds to 240" in warn


def test_a_partial_slurm_section_keeps_the_training_job_s_defaults(tmp_path):
    """A training job's Slurm defaults are a day, 16G, 2 CPUs (a campaign's are 2 hours): a section
    that names one field, in the file or as `slurm.x=`, replaces that field, not the section."""
    whole = TrainConfig().slurm
    assert (whole.time, whole.mem, whole.cpus_per_task) == ("24:00:00", "16G", 2)
    one = load_config(TrainConfig, None, ["slurm.cpus_per_task=3"]).slurm
    assert (one.time, one.mem, one.cpus_per_task) == ("24:00:00", "16G", 3)
    cfg = tmp_path / "t.yaml"
    cfg.write_text("slurm: {partition: gpu, time: '04:00:00'}\n")
    part = load_config(TrainConfig, cfg).slurm
    assert (part.partition, part.time, part.mem, part.cpus_per_task) == ("gpu", "04:00:00", "16G", 2)
    with pytest.raises(UserError, match=r"slurm.tme.*unknown field 'tme'"):
        load_config(TrainConfig, None, ["slurm.tme=1"])
    # the serving job's section: the train config's `serve: {slurm: ...}` over jobs/serve.yaml's, field by field
    from tbhpc.launch.train import serve_config_for
    served = serve_config_for(TrainConfig(model="m", serve_config=str(Path(__file__).parents[1] / "jobs" / "serve.yaml"),
                                          serve={"slurm": {"time": "02:00:00"}})).slurm
    assert (served.time, served.mem, served.cpus_per_task) == ("02:00:00", "64G", 8)
    # a policy's options are not a section: given again, they replace the file's
    from tbhpc.campaign.config import CampaignConfig
    cfg.write_text("policy: oracle\npolicy_opts: {skill: 0.7}\n")
    assert load_config(CampaignConfig, cfg, updates={"policy": "noop", "policy_opts": {}}).policy_opts == {}


def test_export_evals_run_in_the_trainers_container_unless_their_config_names_one():
    """Their scripts name this process's interpreter, the image's: without the image they would not start."""
    from tbhpc.slurm_options import ContainerOptions, SlurmOptions
    from tbhpc.train.jobs import eval_container
    image = ContainerOptions(runtime="apptainer", image="/images/t.sif", python="/opt/tbhpc/.venv/bin/python")
    cfg = TrainConfig(model="m", pool="p", export_eval="jobs/eval.yaml", slurm=SlurmOptions(container=image))
    [override] = eval_container(cfg)
    assert override.startswith("slurm.container=")
    from tbhpc.config import yaml_value
    assert yaml_value(override.split("=", 1)[1], "test") == dataclasses.asdict(image)
    own = dataclasses.replace(cfg, export_eval_overrides=["slurm.container={runtime: pyxis, image: /i.sqsh}"])
    assert eval_container(own) == [] and eval_container(dataclasses.replace(cfg, slurm=SlurmOptions())) == []

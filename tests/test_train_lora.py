"""LoRA GRPO (tbhpc.train.lora): the base frozen, only the adapters in the optimiser, the same update
on 1 rank (ZeRO-0) and 2 ranks (ZeRO-3, partitioned), the published weights merged under the base
model's names; and the reentrant-checkpointing pitfall with a frozen base, shown and avoided."""
import json
import sys
from pathlib import Path

import pytest
import torch

from helpers import cpu_class, run_ranks, train_rows

pytest.importorskip("peft")
pytestmark = pytest.mark.slow
HERE = Path(__file__).parent


def _run(tiny_dir, out: Path, world: int, stage: int, overrides: dict | None = None):
    prefix = str(out / f"w{world}-z{stage}")
    run_ranks(lambda r: [sys.executable, str(HERE / "lora_rank.py"), str(tiny_dir), str(world), str(r), prefix,
                         str(stage), json.dumps(overrides or {})], world)
    return json.loads(Path(prefix + ".json").read_text()), torch.load(prefix + ".pt")


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    return {"z0": _run(tiny_dir, out, 1, 0), "z3": _run(tiny_dir, out, 2, 3),
            "z0-ckpt": _run(tiny_dir, out, 1, 0, {"gradient_checkpointing": True})}


@pytest.mark.kernels
def test_only_the_adapters_train_and_the_base_stays_as_loaded(runs, tiny_dir):
    from transformers import AutoConfig, AutoModelForCausalLM
    info, weights = runs["z0"]
    assert info["trainable"] and all(".lora_A." in n or ".lora_B." in n for n in info["trainable"])
    c = AutoConfig.from_pretrained(tiny_dir)
    kv = c.num_key_value_heads * (getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    q = c.num_attention_heads * (getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    per_layer = 4 * ((c.hidden_size + q) + 2 * (c.hidden_size + kv) + (q + c.hidden_size)
                     + 2 * (c.hidden_size + c.intermediate_size) + (c.intermediate_size + c.hidden_size))
    assert info["optimised"] == per_layer * c.num_hidden_layers       # rank 4 x (in + out) per adapted layer
    base = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    sd = weights["sd"]
    for name, t in sd.items():
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        if ".lora_" not in name:
            assert torch.equal(t, base[plain]), name                   # frozen: bit for bit
    assert any(t.abs().max() > 0 for n, t in sd.items() if ".lora_B." in n), "lora_B left at its zero init"


@pytest.mark.kernels
def test_the_published_weights_are_merged_under_the_base_names(runs, tiny_dir):
    from transformers import AutoModelForCausalLM
    info, weights = runs["z0"]
    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    names = [n for n, _ in base.named_parameters()]
    assert info["meta"] == names                                       # what syncs and exports list
    sd, merged = weights["sd"], weights["merged"]
    scale = 8.0 / 4
    for name in names:
        key = "base_model.model." + name
        layer = key.removesuffix(".weight")
        if f"{layer}.lora_A.default.weight" in sd:
            want = sd[f"{layer}.base_layer.weight"] + scale * sd[f"{layer}.lora_B.default.weight"] @ sd[f"{layer}.lora_A.default.weight"]
            assert torch.allclose(merged[name], want, atol=1e-6), name
            assert not torch.equal(merged[name], sd[f"{layer}.base_layer.weight"]), name
        else:
            assert torch.equal(merged[name], sd[key]), name


@pytest.mark.kernels
def test_the_published_adapter_is_the_update_with_its_scale_folded_in(runs):
    """A LoRA sync publishes the adapters alone: A as trained, B times alpha / r (serve/adapter.py), so
    W + B A is the merged weight with no scale left to apply; ZeRO-3 gathers the same tensors."""
    weights = runs["z0"][1]
    adapter, merged, sd = weights["adapter"], weights["merged"], weights["sd"]
    layers = sorted({n.rsplit(".lora_", 1)[0] for n in adapter})
    assert len(layers) == 2 * 7 and len(adapter) == 2 * len(layers)          # 2 layers x 7 targets, A and B
    for layer in layers:
        a, b = adapter[f"{layer}.lora_A.weight"], adapter[f"{layer}.lora_B.weight"]
        assert a.dtype == b.dtype == torch.float32 and a.shape[0] == b.shape[1] == 4
        assert torch.equal(b, sd[f"base_model.model.{layer}.lora_B.default.weight"].float() * 2.0)    # alpha 8 / r 4
        base = sd[f"base_model.model.{layer}.base_layer.weight"]
        assert torch.allclose(base + b @ a, merged[f"{layer}.weight"], atol=1e-6)
    z3 = runs["z3"][1]["adapter"]
    assert z3.keys() == adapter.keys() and all(torch.allclose(z3[n], adapter[n], atol=1e-5) for n in adapter)


@pytest.mark.kernels
def test_zero3_on_two_ranks_makes_the_update_of_one_rank(runs):
    (one, w1), (two, w2) = runs["z0"], runs["z3"]
    assert two["meta"] == one["meta"] and two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    diff = max((w1["merged"][k] - w2["merged"][k]).abs().max().item() for k in w1["merged"])
    assert diff < 1e-5, (diff, cpu_class())


@pytest.mark.kernels
def test_gradient_checkpointing_trains_the_adapters_too(runs):
    (plain, w), (ckpt, wc) = runs["z0"], runs["z0-ckpt"]
    assert ckpt["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4) and ckpt["grad_norm"] > 0
    assert max((w["merged"][k] - wc["merged"][k]).abs().max().item() for k in w["merged"]) < 1e-5


@pytest.mark.parametrize("reentrant", [True, False])
def test_adapters_get_gradients_through_checkpointed_layers_of_a_frozen_base(tiny_dir, reentrant):
    """The pitfall: reentrant checkpointing recomputes a layer only for inputs that require grad, and
    with the base (embeddings included) frozen none does, so adapters inside checkpointed layers could
    get no gradient. The trainer turns checkpointing on before wrapping and asks for non-reentrant
    checkpointing under LoRA; with this transformers and peft, gradients flow through either kind even
    without peft's input-grad hook. This pins it: every adapter matrix of every layer gets a gradient."""
    from transformers import AutoModelForCausalLM

    from tbhpc.train.lora import wrap
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model = wrap(model, 4, 8.0, 0.0, ["q_proj", "v_proj"])
    model.get_base_model().disable_input_require_grads()    # peft's own workaround off
    model.train()
    with torch.no_grad():           # lora_B starts at zero: give it a value so lora_A's gradient is not 0 by construction
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.02)
    ids = torch.randint(0, model.config.vocab_size, (1, 24))
    model(input_ids=ids, labels=ids).loss.backward()
    adapters = [(n, p.grad) for n, p in model.named_parameters() if ".lora_" in n]
    assert adapters and all(g is not None and g.abs().max() > 0 for _, g in adapters), [n for n, g in adapters if g is None]
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)     # the base: frozen


def _train(run: Path, warm_dir, pool: Path, steps: int):
    import os
    import subprocess
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    p = subprocess.run([sys.executable, "-m", "tbhpc.cli", "train", str(run), f"model={warm_dir}", f"pool={pool}",
                        "generator=local", f"steps={steps}", "group_size=4", "groups_per_step=2", "max_draws=8",
                        "max_tokens=48", "response_budget=160", "lr=1e-2", "microbatch_tokens=4096", "seed=3",
                        "lora_rank=4", "lora_targets=[q_proj, v_proj]", "export_merged=true"], cwd=HERE.parent,
                       env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def lora_run(warm_dir, tmp_path_factory):
    """Two steps of `tbhpc train` with lora_rank 4 on q and v, the in-process generator."""
    tmp = tmp_path_factory.mktemp("lora-train")
    (tmp / "pool.yaml").write_text("tasks: [consulting-leave_balance-001, consulting-leave_balance-002]\n")
    _train(tmp / "run", warm_dir, tmp / "pool.yaml", 2)
    return tmp / "run", tmp / "pool.yaml"


def test_a_stopped_lora_run_resumes_to_the_adapters_of_an_uninterrupted_one(lora_run, warm_dir, tmp_path):
    """One step, stopped; the same run resumed to two: it restores the adapters and their optimiser
    states from the DeepSpeed checkpoint, draws step 2 as the uninterrupted run did, and ends on the
    same adapter (same process count: the same arithmetic)."""
    from tbhpc.serve.adapter import read_adapter
    ref, pool = lora_run
    run = tmp_path / "run"
    _train(run, warm_dir, pool, 1)
    p = _train(run, warm_dir, pool, 2)
    assert "resumed from the DeepSpeed checkpoint of step 1" in p.stdout + p.stderr
    assert train_rows(run) == train_rows(ref)
    a, b = read_adapter(ref / "exports" / "step-000002"), read_adapter(run / "exports" / "step-000002")
    assert a.keys() == b.keys() and all(torch.allclose(a[n], b[n], atol=1e-7) for n in a)


def test_a_lora_training_run_publishes_adapters_and_exports_both_ways(lora_run, warm_dir):
    """`tbhpc train` with lora_rank 4 (the in-process generator, two steps): each step publishes its
    adapter alone (PEFT's format, the marker says so), step 2 samples from step 1's adapter on the base,
    and the last step exports the adapter and, with export_merged, a plain HF checkpoint (no peft
    needed) equal to the base with that adapter merged, differing from the warm start in the adapted
    layers only."""
    import duckdb
    from transformers import AutoModelForCausalLM

    from helpers import checkpoint_weights
    from tbhpc.serve.adapter import read_adapter
    from tbhpc.serve.checkpoints import published
    from tbhpc.train.lora import load_adapted
    run, _ = lora_run
    pub = published(run, 2)
    assert pub.weights == "adapter" and sorted(pub.digests) == ["bfloat16", "float32"]
    logged = [json.loads(line) for line in (run / "logs" / "publish.jsonl").read_text().splitlines()]
    adapter = read_adapter(pub.path)
    assert [(x["step"], x["weights"], x["bytes"]) for x in logged] == [
        (n, "adapter", sum(t.numel() * 4 for t in adapter.values())) for n in (1, 2)]
    assert set(pub.digests["float32"]["tensors"]) == set(adapter)
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    assert con.execute("SELECT step, policy_version FROM train_steps ORDER BY step").fetchall() == [
        (1, "base"), (2, "step-000001")]
    con.close()
    export = run / "exports" / "step-000002"
    config = json.loads((export / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 4, ["q_proj", "v_proj"])
    assert read_adapter(export).keys() == adapter.keys()
    assert {n.rsplit(".lora_", 1)[0].rsplit(".", 1)[1] for n in adapter} == {"q_proj", "v_proj"}
    merged = run / "exports" / "step-000002-merged"
    AutoModelForCausalLM.from_pretrained(merged)           # loads as a plain checkpoint
    new, old = checkpoint_weights(merged), checkpoint_weights(Path(warm_dir))
    assert new.keys() == old.keys()
    changed = {k for k in old if not (new[k] == old[k]).all()}
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in changed), sorted(changed)[:5]
    by_peft = load_adapted(str(warm_dir), str(export)).state_dict()        # peft reads the exported adapter
    assert all(torch.allclose(by_peft[k], torch.from_numpy(new[k]), atol=1e-6) for k in changed)


@pytest.mark.parametrize("fields, message", [
    ({"lora_rank": -1}, "field 'lora_rank' must be a whole number >= 0"),
    ({"lora_rank": 8, "lora_alpha": 0}, "field 'lora_alpha' must be > 0"),
    ({"lora_rank": 8, "lora_dropout": 1.0}, "field 'lora_dropout' must be in [0, 1)"),
    ({"lora_rank": 8, "lora_targets": []}, "field 'lora_targets' must name the linear layers"),
    ({"lora_rank": 8, "lora_sync": "files"}, "field 'lora_sync' must be adapter or merged"),
])
def test_bad_lora_fields_are_one_line(fields, message):
    from tbhpc.errors import UserError
    from tbhpc.train.config import TrainConfig
    with pytest.raises(UserError) as exc:
        TrainConfig(model="m", pool="-", **fields)
    assert message in str(exc.value) and "\n" not in str(exc.value)

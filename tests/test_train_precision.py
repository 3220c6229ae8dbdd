"""A ZeRO-3 run trains in the dtype it asks for on every CPU class, and refuses one it did not get.

DeepSpeed 0.19.8's `zero.Init` ignored an explicit fp32 on CPUs whose oneDNN has no fp16 (AVX2, and
AVX-512 without AVX512-FP16) and built bf16 parameters (tbhpc/train/precision.py). The class is forced
here through the accelerator's answer, so each case runs as that class on any machine."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from helpers import cpu_class, run_ranks

HERE = Path(__file__).parent       # (the cases force the CPU class themselves: only the cap's own test is `kernels`)


def _engine(model, tmp_path, world: int, fp16: str, mode: str = "plain", **fields) -> dict:
    out = tmp_path / f"w{world}-{fp16}-{mode}.json"
    run_ranks(lambda r: [sys.executable, str(HERE / "dtype_rank.py"), str(model), str(world), str(r), str(out),
                         fp16, mode, json.dumps(fields)], world)
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("world,fp16", [(1, "no"), (2, "no"), (1, "yes")])
def test_zero3_parameters_stay_fp32_whatever_the_cpu_says_about_fp16(warm_dir, tmp_path, world, fp16):
    seen = _engine(warm_dir, tmp_path, world, fp16)
    assert seen["fp16_supported"] == (fp16 == "yes")
    assert list(seen["dtypes"]) == ["float32"], (cpu_class(), seen)
    assert seen["export"] == ["torch.float32"], (cpu_class(), seen)


@pytest.mark.slow
def test_a_bf16_lora_run_keeps_peft_s_fp32_adapters_over_its_bf16_base(warm_dir, tmp_path):
    """The GPU's LoRA run (ZeRO-3, bf16): peft makes its adapters fp32 on purpose, and the check lets them be."""
    seen = _engine(warm_dir, tmp_path, 1, "no", dtype="bf16", lora_rank=4)
    assert "refused" not in seen, seen["refused"]
    assert seen["adapters"] == ["float32"] and seen["dtypes"]["bfloat16"] > 0, seen


@pytest.mark.slow
def test_a_bf16_zero3_run_accumulates_and_reduces_gradients_in_fp32(warm_dir, tmp_path):
    """The GPU's run (ZeRO-3, bf16): DeepSpeed would sum a step's micro-batches into bf16 gradient partitions
    and reduce-scatter them in bf16 (its defaults follow the model's dtype); tbhpc asks fp32 for both, and
    DeepSpeed 0.19.8 takes the pair at stage 3 and steps with it (2 ranks: the reduction runs)."""
    seen = _engine(warm_dir, tmp_path, 2, "no", "update", dtype="bf16")
    assert "refused" not in seen, seen["refused"]
    assert list(seen["dtypes"]) == ["bfloat16"], seen
    assert (seen["grad_accum"], seen["communication"]) == ("float32", "float32"), seen
    assert seen["loss"] == seen["loss"], seen        # a number, not NaN


@pytest.mark.slow
def test_a_zero3_engine_built_in_another_dtype_is_refused_in_one_line_naming_both(warm_dir, tmp_path):
    seen = _engine(warm_dir, tmp_path, 1, "no", "bf16-init")
    msg = seen["refused"]
    assert "\n" not in msg and "float32" in msg and "bfloat16" in msg and "ZeRO stage 3" in msg, msg


def test_the_check_names_the_wrong_dtype_and_passes_the_right_one():
    from tbhpc.train.precision import PrecisionError, check_dtype, stored_dtypes
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    check_dtype(model, "fp32", 0)
    model[1].to(torch.bfloat16)
    assert stored_dtypes(model) == {"float32": ["0.weight", "0.bias"], "bfloat16": ["1.weight", "1.bias"]}
    with pytest.raises(PrecisionError, match=r"trains in float32 .* built 2 of 4 parameters in bfloat16 \(first: 1.weight\)"):
        check_dtype(model, "fp32", 0)
    with pytest.raises(PrecisionError, match="2 of 4 parameters in float32"):
        check_dtype(model, "bf16", 2)
    lora = torch.nn.ModuleDict({"base_layer": torch.nn.Linear(4, 4).to(torch.bfloat16),
                                "lora_A": torch.nn.ModuleDict({"default": torch.nn.Linear(4, 1, bias=False)}),
                                "lora_B": torch.nn.ModuleDict({"default": torch.nn.Linear(1, 4, bias=False)})})
    check_dtype(torch.nn.ModuleDict({"q_proj": lora}), "bf16", 3)      # fp32 adapters over a bf16 base: peft's choice
    with pytest.raises(PrecisionError, match="2 of 4 parameters in bfloat16"):
        check_dtype(torch.nn.ModuleDict({"q_proj": lora}), "fp32", 3)


@pytest.mark.kernels
def test_the_kernel_cap_of_make_tests_second_pass_takes_effect():
    """`make test` runs the `kernels` tests again with torch's kernels capped at AVX2 (Makefile KERNELS_AVX2):
    a cap that a torch release stopped reading would make that pass a copy of the first."""
    cap = os.environ.get("ATEN_CPU_CAPABILITY")
    if not cap:
        pytest.skip("torch's kernels are not capped in this pass (make test's second pass caps them)")
    assert torch.backends.cpu.get_cpu_capability() == cap.upper(), cpu_class()
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() == "AVX2":        # AVX2 has no native bf16: oneDNN says so
        assert not torch.ops.mkldnn._is_mkldnn_bf16_supported(), cpu_class()

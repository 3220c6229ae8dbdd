"""The dtype a run trains in, checked on the parameters DeepSpeed actually built.

Why a check at all: the run's dtype is decided in one place (`dsconfig.resolved_dtype`), but the
tensors are made by DeepSpeed, and a library can quietly disagree. DeepSpeed 0.19.8's `zero.Init`
did: given an explicit `dtype`, an operator-precedence slip in `Init._set_dtype` ignores it whenever
the accelerator reports no fp16 support (the CPU accelerator asks oneDNN, which says no on AVX2
and on AVX-512 parts without AVX512-FP16), and picks bf16, while the run's config, records and
digests say fp32. So the loader lets the DeepSpeed config decide (`loading.load_partitioned`), and
the engine, once built, refuses a run whose parameters are in any other dtype than the run's
(`check_dtype`): a release that changes precision again stops the run in one line instead of
training on. (DeepSpeed's engine has such a check, `__check_params`; its body is `return`.)

One exception is deliberate: LoRA adapters may be fp32 under a bf16 base. peft upcasts the adapters
it creates to fp32 (`autocast_adapter_dtype`, for stable updates), ZeRO-3 partitions them as they
are, and the trained adapters then stay fp32 while the frozen base is bf16.
"""
from __future__ import annotations

from tbhpc.errors import TbhpcError

# what DeepSpeed (and torch) name the dtypes the run config names
TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class PrecisionError(TbhpcError):
    """The trainer's parameters are not in the dtype the run asked for (a library chose another)."""


def stored_dtypes(module) -> dict[str, list[str]]:
    """{dtype name: parameter names} as each parameter's values are held. Under ZeRO-3 a parameter's own
    tensor is an empty placeholder and its values live in its partition (`ds_tensor`, what the
    optimiser updates): both are read, and either in another dtype counts."""
    out: dict[str, list[str]] = {}
    for name, p in module.named_parameters():
        held = {str(p.dtype).removeprefix("torch.")}
        part = getattr(p, "ds_tensor", None)
        if part is not None:
            held.add(str(part.dtype).removeprefix("torch."))
        for dtype in held:
            out.setdefault(dtype, []).append(name)
    return out


def check_dtype(module, run_dtype: str, zero_stage: int) -> None:
    """Refuse (one line, both dtypes named) a model whose parameters are not all in `run_dtype`
    ('fp32' or 'bf16', as `resolved_dtype` says), but for fp32 LoRA adapters (module docstring)."""
    want = TORCH_NAMES[run_dtype]
    found = stored_dtypes(module)
    wrong = {d: [n for n in names if not (d == "float32" and _is_adapter(n))] for d, names in found.items() if d != want}
    wrong = {d: names for d, names in wrong.items() if names}
    if not wrong:
        return
    total = sum(1 for _ in module.parameters())
    dtype, names = max(wrong.items(), key=lambda kv: len(kv[1]))
    raise PrecisionError(
        f"the run trains in {want} ({run_dtype}), but DeepSpeed (ZeRO stage {zero_stage}) built "
        f"{len(names)} of {total} parameters in {dtype} (first: {names[0]}); refusing to train in a precision "
        f"the run's config and records do not say (check the DeepSpeed version against pyproject.toml's pin)")


def _is_adapter(name: str) -> bool:
    """A LoRA adapter's matrix as peft names it (`...q_proj.lora_A.default.weight`)."""
    return ".lora_A." in name or ".lora_B." in name

"""A vLLM worker extension (`--worker-extension-cls tbhpc_vllm_worker.WeightSync`): an in-place
weight reload that serves exactly the new weights on every kernel path, and a report of which
path each linear layer took.

Why: on CPU, vLLM runs each linear layer through `layer.cpu_linear`, a closure built after the
weights load (`dispatch_cpu_unquantized_gemm`): a oneDNN matmul handle, sgl-kernel packed
weights (AMX), zentorch, or plain `F.linear` on the parameter. The first three hold their own
copy of the weights. vLLM's layerwise reload re-runs that step for every layer whose weights it
loads, but a layer whose weights arrive through another (tied) layer is never "loaded": a tied
`lm_head` keeps the packed copy of the *old* embedding while the embedding itself is new, so the
server computes logits with old weights on top of a new body (neither checkpoint). Where the
dispatch falls back to `F.linear` (e.g. bf16 on a CPU without AVX-512-BF16 or AMX) the copy
does not exist and nothing goes stale, so whether the fault shows depends on the machine.

`tbhpc_reload` = vLLM's own reload, then: every layer whose kernel closure is still the one from
before the reload and whose weight is still there gets its post-load dispatch re-run; a layer
whose closure is stale and whose weight vLLM already freed cannot be refreshed here, and the
reload says so (the supervisor then restarts the server, which is exact by construction).
On GPU no layer has `cpu_linear`; the extension only reloads and reports "gpu".

`tbhpc_receive` = the same reload from tensors the trainer broadcasts (tbhpc_wire.py) instead of files.

`tbhpc_load_adapter` = a LoRA run's sync: the step's adapter replaces the served one in place
(tbhpc_adapter.py); the base weights are never touched.

`tbhpc_digest` = exact digests of every weight as this worker computes with it (parameters and
packed kernel copies, named like the checkpoint's tensors: `tbhpc_served_digest.py`), which the
supervisor compares with the digests the publisher wrote into the ready marker.

Test-only faults, never set in production: when the server's environment names a file in
TBHPC_TEST_FAULT_FILE, each reload reads it: `skip_reload` (a reload that reads nothing: the
server keeps its old weights), `no_repack` (vLLM's reload alone: the stale packed copies
described above, on CPUs whose kernels pack) or `flip:<checkpoint tensor name>` (after the
reload, one element of that tensor moves by one ulp in the served copy: the parameter, or the
packed kernel copy where the parameter was freed); an empty or missing file is no fault. A file,
not a variable, so one server can go through several faults.
Runs inside the vLLM environment: imports only torch and vLLM, lazily.
"""
from __future__ import annotations

import os
import time
from collections import Counter

FAULT_FILE_ENV = "TBHPC_TEST_FAULT_FILE"


def _fault() -> str:
    path = os.environ.get(FAULT_FILE_ENV)
    if not path:
        return ""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def kernel_path(layer) -> str | None:
    """The GEMM path of one layer: onednn | sgl | zentorch | torch (F.linear), None if not a
    CPU-dispatched linear layer."""
    fn = getattr(layer, "cpu_linear", None)
    if fn is None:
        return None
    names = set(getattr(getattr(fn, "__code__", None), "co_freevars", ()) or ())
    if "handler" in names:
        return "onednn"
    if "packed_weight" in names:
        return "sgl"
    if "zen_weight" in names:
        return "zentorch"
    return "torch"


def _weight_present(layer) -> bool:
    w = getattr(layer, "weight", None)
    return w is not None and w.ndim == 2 and w.numel() > 0 and not w.is_meta


class WeightSync:
    """Mixed into vLLM's worker class; methods are called with collective_rpc."""

    def tbhpc_kernel_paths(self) -> dict:
        model = self.model_runner.get_model()
        paths = Counter(p for _, m in model.named_modules() if (p := kernel_path(m)) is not None)
        if not paths:   # GPU (or any platform without CPU dispatch): linear layers read their parameters
            paths = Counter("gpu" for _, m in model.named_modules() if hasattr(m, "quant_method") and hasattr(m, "weight"))
        dtype = str(self.vllm_config.model_config.dtype).removeprefix("torch.")
        # vLLM 0.32 runs its "model runner V2" on CUDA by default and a V1-derived one on CPUs: every
        # CPU test ran the latter, so a sync record says which one took the weights
        runner = type(self.model_runner)
        return {"paths": dict(paths), "dtype": dtype, "runner": f"{runner.__module__}.{runner.__name__}"}

    def tbhpc_place(self, replicas: int = 0) -> dict:
        """Where this worker sits: data-parallel replica, pipeline stage, tensor-parallel rank (of sizes).
        vLLM runs the replicas of a dense model as independent engines (each configured as data
        parallel 1); `data_parallel_index` keeps the replica's number, the caller knows how many."""
        from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank
        parallel = self.vllm_config.parallel_config
        index = getattr(parallel, "data_parallel_index", None)
        dp_rank = int(index if index is not None else getattr(parallel, "data_parallel_rank", 0) or 0)
        return {"dp_rank": dp_rank, "dp": int(replicas or parallel.data_parallel_size),
                "pp_rank": int(get_pp_group().rank_in_group), "pp": int(parallel.pipeline_parallel_size),
                "tp_rank": int(get_tensor_model_parallel_rank()), "tp": int(parallel.tensor_parallel_size)}

    def tbhpc_digest(self, report_dir: str = "", replicas: int = 0, adapter: bool = False) -> dict:
        """This worker's digests of the weights it computes with (see tbhpc_served_digest), or with
        `adapter` of the LoRA adapter it serves (tbhpc_adapter), with its place. Also written to
        `report_dir` (one file per worker): with data parallelism vLLM's RPC returns the first
        replica's answers only, and every replica must be checked."""
        place = self.tbhpc_place(int(replicas))
        dtype = self.vllm_config.model_config.dtype
        if adapter:     # a failure is reported, not raised: an exception in an RPC ends vLLM's engine
            from tbhpc_adapter import adapter_digests
            try:
                report = {**adapter_digests(self, dtype, place["tp_rank"]), **place}
            except Exception as exc:
                report = {"error": f"{type(exc).__name__}: {exc}", **place}
        else:
            from tbhpc_served_digest import served_digests
            report = {**served_digests(self.model_runner.get_model(), dtype, kernel_path, place["tp_rank"]), **place}
        if report_dir:
            _write_json(os.path.join(report_dir, f"dp{place['dp_rank']}-pp{place['pp_rank']}-tp{place['tp_rank']}.json"),
                        report)
        return report

    def tbhpc_reload(self, weights_path: str) -> dict:
        """vLLM's in-place reload from a checkpoint directory, then the kernel copies it left stale."""
        return self._reload(lambda: self.reload_weights(weights_path=weights_path, is_checkpoint_format=True))

    def tbhpc_load_adapter(self, path: str, name: str) -> dict:
        """A LoRA sync: the adapter in the PEFT directory `path` replaces the one this worker serves
        (tbhpc_adapter.load_adapter). Test faults as for a reload: `skip_reload` loads nothing,
        `flip:<adapter tensor>` moves one element of the loaded adapter by one ulp."""
        from tbhpc_adapter import flip_adapter, load_adapter
        fault = _fault()
        if fault == "skip_reload":
            return {"load_s": 0.0, "test_fault": fault}
        report = load_adapter(self, path, name)
        if fault.startswith("flip:"):
            flip_adapter(self, fault.removeprefix("flip:"))
            report["test_fault"] = fault
        return report

    def tbhpc_receive(self, host: str, port: int, world: int, meta: list, bucket_bytes: int,
                      timeout_s: float = 600.0) -> dict:
        """Join the trainer's broadcast (tbhpc_wire) and load the tensors as the buckets arrive, then
        refresh kernel copies exactly as a file reload does. Every worker of every replica receives
        every full tensor (vLLM's loaders cut their shards); its group rank follows its place.
        Never raises (an exception in an RPC ends vLLM's engine): a group that did not form or was
        not trusted leaves the weights as they were ("unjoined", "untrusted"); a stream that broke
        while loading says "failed" (the weights are then a mix, and the supervisor refuses them)."""
        from tbhpc_auth import read_token_file
        from tbhpc_wire import join, take
        place = self.tbhpc_place()
        rank = 1 + (place["dp_rank"] * place["pp"] + place["pp_rank"]) * place["tp"] + place["tp_rank"]
        device = str(getattr(self, "device", "cpu") or "cpu")
        t0 = time.perf_counter()
        group, why_not = join(host, int(port), rank, int(world), device, timeout_s, read_token_file())
        if group is None:
            return {**why_not, "rank": rank}
        joined = time.perf_counter()

        def load(stream) -> dict:
            if _fault() == "skip_reload":          # take the bytes (the sender must finish), load nothing
                for _ in stream:
                    pass
                return {**self.tbhpc_kernel_paths(), "refreshed": [], "stale": [], "reload_s": 0.0,
                        "refresh_s": 0.0, "test_fault": "skip_reload"}
            return self._reload(lambda: self.reload_weights(weights_iterator=stream, is_checkpoint_format=True))

        report = take(group, meta, int(bucket_bytes), load)
        report.update({"join_s": round(joined - t0, 4), "rank": rank})
        return report

    def _reload(self, load) -> dict:
        """Run `load` (vLLM's layerwise reload from files or from a tensor stream), then re-dispatch
        every layer whose kernel closure survived it (its packed copy holds the old weights)."""
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        t0 = time.perf_counter()
        model = self.model_runner.get_model()
        fault = _fault()
        if fault == "skip_reload":          # silently keep the old weights (nothing re-packed, nothing stale)
            return {**self.tbhpc_kernel_paths(), "refreshed": [], "stale": [], "reload_s": 0.0, "refresh_s": 0.0,
                    "test_fault": fault}
        before = {name: getattr(m, "cpu_linear", None) for name, m in model.named_modules()}
        load()
        t1 = time.perf_counter()
        refreshed, stale = [], []
        for name, m in ([] if fault == "no_repack" else model.named_modules()):
            fn = getattr(m, "cpu_linear", None)
            if fn is None or fn is not before.get(name) or kernel_path(m) == "torch":
                continue               # re-dispatched by the reload, or reads the parameter itself
            if _weight_present(m):
                dispatch_cpu_unquantized_gemm(m, remove_weight=False)
                refreshed.append(name)
            else:
                stale.append(name)
        if fault.startswith("flip:"):
            _flip_one(model, fault.removeprefix("flip:"), self.vllm_config.model_config.dtype)
        report = self.tbhpc_kernel_paths()
        report.update({"refreshed": refreshed, "stale": stale, "reload_s": round(t1 - t0, 4),
                       "refresh_s": round(time.perf_counter() - t1, 4)})
        if fault:
            report["test_fault"] = fault
        if stale:
            raise RuntimeError(f"tbhpc_reload: {len(stale)} layer(s) keep packed copies of the old weights and "
                               f"cannot be re-packed in place ({', '.join(stale[:4])}); restart the server")
        return report


def _write_json(path: str, data: dict) -> None:
    import json
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _flip_one(model, tensor: str, dtype) -> None:
    """Test-only: move one element of checkpoint tensor `tensor` by one ulp in the served copy."""
    import torch
    from tbhpc_digest import _BITS
    from tbhpc_served_digest import _pieces, read_kernel_weight
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    mod_name, _, pname = tensor.rpartition(".")
    head, _, last = mod_name.rpartition(".")
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    fused = next((k for k, subs in packed.items() if last in subs), None)
    holder = f"{head}.{fused}" if fused else mod_name      # the module whose tensor holds those rows
    module = model.get_submodule(holder)
    param = getattr(module, pname)
    rows = sum(getattr(module, "output_partition_sizes", None) or [param.shape[0] if param.ndim else 1])
    row0 = next(pc.row0 for pc in _pieces(holder, module, rows, packed, 0) if pc.name == mod_name)
    ints, _, exponent, _ = _BITS[dtype]
    if param.numel():                           # the parameter is what the layer reads
        flat = param.data[row0:].view(ints).reshape(-1)
        flat[int(torch.nonzero(flat & exponent)[0])] ^= 1      # a normal number's last mantissa bit
        return
    weight = torch.cat([w for _, w in read_kernel_weight(module, dtype)], dim=1).contiguous()
    weight.view(ints)[row0, 0] ^= 1             # a packed copy: rebuild it from the moved weight
    module.weight = torch.nn.Parameter(weight, requires_grad=False)
    dispatch_cpu_unquantized_gemm(module, remove_weight=True)

"""`tbhpc doctor [CONFIG]`: what this node will run, and what would break the given training config.

Why: the failures of a GPU cluster are found hours in, one at a time, on the nodes themselves (a
JIT-compiled optimizer without nvcc, a CPU vLLM built on a login node, no GPU where the config asks
for eight, a model that does not fit). Run on a compute node (`srun -N1 tbhpc doctor CONFIG`), it
lists the stack once and says, one line per problem, what would stop the run there.

`probe()` reads the node (imports, executables, environment); `problems()` and `render()` are pure
functions of what it read and the config, so they are tested without the node they describe.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field


@dataclass
class Node:
    python: str = ""
    torch: str = ""
    torch_cuda: str = ""            # the CUDA torch was built for ("" for a CPU build)
    gpus: list[str] = field(default_factory=list)
    nccl: str = ""
    deepspeed: str = ""
    deepspeed_ops: list[str] = field(default_factory=list)     # ops built at install time
    transformers: str = ""
    flash_attn: bool = False
    nvcc: str = ""
    cxx: str = ""
    vllm_python: str = ""
    vllm_build: str = ""            # cpu | cuda | "" (not found or unreadable)
    vllm_what: str = ""
    slurm: str = ""                 # sbatch's path, or ""
    slurm_job: str = ""


def probe(vllm_python: str | None = None) -> Node:
    """This node, as the trainer and the serving job would find it."""
    n = Node(python=sys.version.split()[0])
    try:
        import torch
        n.torch, n.torch_cuda = torch.__version__, torch.version.cuda or ""
        if torch.cuda.is_available():
            n.gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            try:
                n.nccl = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:          # a build without NCCL
                n.nccl = ""
    except ImportError:
        pass
    spec = importlib.util.find_spec("deepspeed")
    if spec is not None and spec.origin:
        from importlib.metadata import version
        n.deepspeed = version("deepspeed")
        n.deepspeed_ops = _prebuilt_ops(os.path.join(os.path.dirname(spec.origin), "git_version_info_installed.py"))
    if importlib.util.find_spec("transformers") is not None:
        from importlib.metadata import version
        n.transformers = version("transformers")
    n.flash_attn = importlib.util.find_spec("flash_attn") is not None
    n.nvcc = shutil.which("nvcc") or ""
    n.cxx = shutil.which(os.environ.get("CXX", "g++")) or ""
    from tbhpc.serve.config import default_vllm_python
    from tbhpc.serve.server import vllm_build
    n.vllm_python = vllm_python or default_vllm_python()
    n.vllm_build, n.vllm_what = vllm_build(n.vllm_python)
    n.slurm = shutil.which("sbatch") or ""
    n.slurm_job = os.environ.get("SLURM_JOB_ID", "")
    return n


def _prebuilt_ops(path: str) -> list[str]:
    """The ops DeepSpeed's installer built, read from the file it wrote (importing deepspeed would
    detect accelerators and log on stdout)."""
    import ast
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError):
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "installed_ops" for t in node.targets):
            try:
                return sorted(k for k, v in ast.literal_eval(node.value).items() if v)
            except ValueError:
                return []
    return []


def problems(node: Node, cfg=None, serve=None) -> list[str]:
    """One line per thing that would stop `cfg` (a TrainConfig; `serve`: its serving job's config) on
    this node; [] when nothing would."""
    out: list[str] = []
    if cfg is None:
        return out
    gpu = cfg.gpus_per_node > 0
    if not node.deepspeed:
        out.append("the trainer needs DeepSpeed: run `make env` (the train extra)")
    if gpu and not node.torch_cuda:
        out.append(f"gpus_per_node is {cfg.gpus_per_node} but torch {node.torch or '(missing)'} here is a CPU build: "
                   f"install the CUDA torch of your cluster before `make env`")
    elif gpu and len(node.gpus) == 0:
        out.append(f"gpus_per_node is {cfg.gpus_per_node} but this node sees no GPU (run doctor on a compute node: "
                   f"srun -N1 --gpus-per-node={cfg.gpus_per_node} tbhpc doctor CONFIG)")
    elif gpu and len(node.gpus) not in (1, cfg.gpus_per_node):
        out.append(f"gpus_per_node is {cfg.gpus_per_node} but this task sees {len(node.gpus)} GPUs: Slurm must show "
                   f"each task one GPU or the node's {cfg.gpus_per_node}")
    if gpu and cfg.offload_optimizer and not node.cxx:
        out.append("offload_optimizer on GPU uses DeepSpeed's CPU Adam, built with a C++ compiler on first use: "
                   "none found (g++, or $CXX)")
    if serve is not None and cfg.generator == "server":
        if not node.vllm_build:
            out.append(f"the serving job's vLLM environment {node.vllm_python}: {node.vllm_what} "
                       f"(build it: `make env-vllm VLLM_BUILD={'cuda' if serve.device == 'cuda' else 'cpu'}`)")
        elif serve.device in ("cpu", "cuda") and serve.device != node.vllm_build:
            out.append(f"serve device {serve.device} but {node.vllm_python} is the {node.vllm_build} build "
                       f"({node.vllm_what}): `make env-vllm VLLM_BUILD={serve.device}`")
    return out


def render(node: Node, found: list[str], notes: list[str] = (), subject: str = "the config") -> str:
    """The report (pure)."""
    gpus = f"{len(node.gpus)} x {node.gpus[0]}" if node.gpus else "none visible"
    rows = [("python", node.python),
            ("torch", f"{node.torch or 'missing'} ({'CUDA ' + node.torch_cuda if node.torch_cuda else 'CPU build'})"),
            ("GPUs", gpus + (f", NCCL {node.nccl}" if node.nccl else "")),
            ("DeepSpeed", (node.deepspeed or "missing") + (f" (ops built: {', '.join(node.deepspeed_ops)})"
                                                          if node.deepspeed_ops else " (no ops prebuilt; the trainer "
                                                          "needs none: torch's AdamW)" if node.deepspeed else "")),
            ("transformers", node.transformers or "missing"),
            ("flash-attn", "installed" if node.flash_attn else "not installed (SDPA: packed rows build a T x T mask)"),
            ("nvcc", node.nvcc or "not found"), ("C++ compiler", node.cxx or "not found"),
            ("vLLM env", f"{node.vllm_python}: {node.vllm_build or 'unknown'} build ({node.vllm_what})"),
            ("Slurm", (node.slurm or "no sbatch") + (f" (in job {node.slurm_job})" if node.slurm_job else ""))]
    lines = ["tbhpc doctor: this node"] + [f"  {k:<13} {v}" for k, v in rows]
    lines += [f"  note: {n}" for n in notes]
    lines.append(f"  nothing here would stop {subject}" if not found else
                 f"  {len(found)} thing(s) would stop {subject} (below)")
    return "\n".join(lines)

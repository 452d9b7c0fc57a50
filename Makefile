# make        set up .venv (torch 2.13.0 CPU + deps) and build hvdtorch (incremental)
# make test   C++ unit tests (ctest) + Python multi-process tests (pytest)
# make demo   the main job: multi-process training on CPU through torchrun
# make mutants  mutation testing: every mutation in tools/mutants.toml must fail its tests (not part of make test)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export MAX_JOBS ?= 2
# Open MPI refuses to run as root unless told it is fine (CI runs as root).
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
BUILD_DIR := build/cmake
PYTEST_ARGS ?=

.PHONY: all build test test-cpp test-py demo mutants clean system-deps

all: build

# Debian packages: Open MPI (mpirun, and headers for mpi4py) and ccache.
$(VENV)/.system-deps:
	@if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null || ! command -v ccache >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev ccache >/dev/null; \
	  else \
	    echo "hvdtorch: please install openmpi-bin libopenmpi-dev ccache (needs root)"; exit 1; \
	  fi; \
	fi
	@mkdir -p $(VENV) && touch $@

$(VENV)/.deps: requirements-dev.txt requirements-lightning.txt $(VENV)/.system-deps
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -r requirements-dev.txt
	$(PIP) install -q --disable-pip-version-check --no-deps -r requirements-lightning.txt
	@touch $@

build: $(VENV)/.deps
	$(PIP) install -q --disable-pip-version-check --no-build-isolation --no-deps -e .

test-cpp: build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 300

test-py: build
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

test: test-cpp test-py

demo: build
	$(PY) examples/demo.py

# Builds its own copy of the tree under build/mutants (ccache keeps that cheap);
# MUTANTS_ARGS takes mutation ids or options, e.g. MUTANTS_ARGS="-j2 ring-*".
MUTANTS_ARGS ?=
mutants: $(VENV)/.deps
	$(PY) tools/mutants.py --venv $(VENV) $(MUTANTS_ARGS)

clean:
	rm -rf build hvdtorch/_C*.so *.egg-info

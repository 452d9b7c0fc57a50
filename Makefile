# make        set up .venv (torch 2.13.0 CPU + deps) and build hvdtorch (incremental)
# make test   C++ unit tests (ctest) + Python multi-process tests (pytest)
# make demo   the main job: multi-process training on CPU through torchrun
# make mutants  mutation testing: every mutation in tools/mutants.toml must fail its tests (not part of make test)
# make sanitize the C++ unit tests under ASan+UBSan (build/asan) and TSan (build/tsan)
# make fuzz     long fuzzing: many seeds of op sequences, and the control-plane decoder for FUZZ_SECONDS
# make soak     20,000 DistributedModel steps and 1,000 init()/shutdown() cycles, nothing may grow
# make bench-training  hvdtorch vs Horovod 0.28.1, DDP and solo, training img/s under mpirun and torchrun (not part of make test)

# make lint   clang-format check, ruff check, ruff format check, clang-tidy on csrc/core
# make format apply clang-format (csrc) and ruff's import sorting and formatter
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
# Lint tools. The major version is pinned: formatting differs between releases.
CLANG_FORMAT ?= clang-format-19
CLANGXX ?= clang++-19
RUN_CLANG_TIDY ?= run-clang-tidy-19
RUFF := $(VENV)/bin/ruff
# compile_commands.json of a core-only configure (no torch needed) for clang-tidy.
LINT_BUILD_DIR := build/lint
CXX_FILES = $(shell find csrc -name '*.h' -o -name '*.cc' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' | sort)
TIDY_JOBS ?= $(MAX_JOBS)

.PHONY: all build test test-cpp test-py test-fuzz-wire demo bench-training mutants sanitize fuzz soak scale test-asan test-tsan clean system-deps lint \
        format lint-clang-format lint-ruff lint-ruff-format lint-clang-tidy

all: build

# Debian packages: Open MPI (mpirun, and headers for mpi4py), ccache, the
# C++ lint tools (clang-format, clang-tidy with run-clang-tidy) of LLVM 19, and
# clang 19 with its sanitizer and libFuzzer runtimes (make sanitize, the fuzz target).
# Re-checked whenever this Makefile changes (a cheap `command -v` when present).
SYSTEM_PACKAGES := openmpi-bin libopenmpi-dev ccache clang-format-19 clang-tidy-19 clang-19 libclang-rt-19-dev
$(VENV)/.system-deps: Makefile
	@if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null || ! command -v ccache >/dev/null || \
	    ! command -v $(CLANG_FORMAT) >/dev/null || ! command -v $(RUN_CLANG_TIDY) >/dev/null || \
	    ! command -v $(CLANGXX) >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
	  else \
	    echo "hvdtorch: please install $(SYSTEM_PACKAGES) (needs root)"; exit 1; \
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

test-py: build $(VENV)/.ray
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

# Ray for tests/test_ray.py (about 500 MB). If it cannot be installed here,
# say so: the test then skips, naming the reason.
$(VENV)/.ray: requirements-ray.txt $(VENV)/.deps
	@if $(PIP) install -q --disable-pip-version-check --no-deps -r requirements-ray.txt; then touch $@; \
	else echo "make: Ray could not be installed; tests/test_ray.py will skip"; fi

test: test-cpp test-fuzz-wire test-py

# ---- sanitizers and fuzzing (clang 19, with the system packages) ---------------
SAN_CMAKE = cmake -S . -G Ninja -DCMAKE_CXX_COMPILER=$(CLANGXX) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHVDTORCH_CUDA=OFF
export ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/csrc/tests/tsan.supp
FUZZ_SECONDS ?= 600
FUZZ_SEEDS ?= 1,2,3,4,5,6,7,8,9,10
FUZZ_STEPS ?= 2000

build/fuzz/fuzz_control_plane: $(VENV)/.system-deps FORCE
	$(SAN_CMAKE) -B build/fuzz -DHVDTORCH_SANITIZE=address,undefined -DHVDTORCH_FUZZ=ON -DHVDTORCH_BUILD_TESTS=OFF >/dev/null
	cmake --build build/fuzz --target fuzz_control_plane -- -j$(MAX_JOBS)

# The control-plane decoder under libFuzzer + ASan/UBSan for 30 s from the committed corpus.
test-fuzz-wire: build/fuzz/fuzz_control_plane
	mkdir -p build/fuzz/corpus
	build/fuzz/fuzz_control_plane -max_total_time=30 -malloc_limit_mb=128 -rss_limit_mb=1024 -timeout=10 \
	  -print_final_stats=1 build/fuzz/corpus csrc/fuzz/corpus

sanitize: test-asan test-tsan

# The C++ unit tests under ASan+UBSan (CI runs this after make test), and under TSan.
test-asan: $(VENV)/.system-deps
	$(SAN_CMAKE) -B build/asan -DHVDTORCH_SANITIZE=address,undefined >/dev/null
	cmake --build build/asan -- -j$(MAX_JOBS)
	cd build/asan && ctest --output-on-failure --timeout 900

test-tsan: $(VENV)/.system-deps
	$(SAN_CMAKE) -B build/tsan -DHVDTORCH_SANITIZE=thread >/dev/null
	cmake --build build/tsan -- -j$(MAX_JOBS)
	cd build/tsan && ctest --output-on-failure --timeout 900

fuzz: build build/fuzz/fuzz_control_plane
	FUZZ_SEEDS=$(FUZZ_SEEDS) FUZZ_STEPS=$(FUZZ_STEPS) $(PY) -m pytest -q tests/test_fuzz.py
	mkdir -p build/fuzz/corpus
	build/fuzz/fuzz_control_plane -max_total_time=$(FUZZ_SECONDS) -malloc_limit_mb=128 -rss_limit_mb=1024 \
	  -timeout=10 -print_final_stats=1 build/fuzz/corpus csrc/fuzz/corpus

soak: build
	SOAK_STEPS=20000 SOAK_CYCLES=1000 $(PY) -m pytest -q -s -p no:timeout tests/test_soak.py

# 32 ranks on this machine's cores: the collectives and a steady state that
# the decentralized negotiation must settle (make test runs 8 ranks).
scale: build
	HVDTORCH_TEST_RANKS=32 $(PY) -m pytest -q -s tests/test_many_ranks.py

FORCE:

demo: build
	$(PY) examples/demo.py

# Builds Horovod into build/horovod-venv first (cached; minutes the first time).
BENCH_ROUNDS ?= 5
BENCH_ITERS ?= 12
bench-training: build
	benchmarks/peers/build_horovod.sh
	benchmarks/run_training.sh --rounds $(BENCH_ROUNDS) --iters $(BENCH_ITERS)

# Builds its own copy of the tree under build/mutants (ccache keeps that cheap);
# MUTANTS_ARGS takes mutation ids or options, e.g. MUTANTS_ARGS="-j2 ring-*".
MUTANTS_ARGS ?=
mutants: $(VENV)/.deps
	$(PY) tools/mutants.py --venv $(VENV) $(MUTANTS_ARGS)

# Every check runs, even after one fails; the summary names the failed ones.
lint: $(VENV)/.deps
	@failed=; \
	for t in lint-clang-format lint-ruff lint-ruff-format lint-clang-tidy; do \
	  $(MAKE) --no-print-directory $$t || failed="$$failed $$t"; \
	done; \
	if [ -n "$$failed" ]; then echo "make lint: FAILED:$$failed"; exit 1; fi; \
	echo "make lint: clean"

lint-clang-format: $(VENV)/.deps
	@echo "== clang-format (csrc, --dry-run -Werror; make format fixes it)"
	@$(CLANG_FORMAT) --dry-run -Werror --ferror-limit=3 $(CXX_FILES)

lint-ruff: $(VENV)/.deps
	@echo "== ruff check"
	@$(RUFF) check .

lint-ruff-format: $(VENV)/.deps
	@echo "== ruff format --check (make format fixes it)"
	@$(RUFF) format --check .

# Only configures (seconds): clang-tidy needs the compile commands, not objects.
lint-clang-tidy: $(VENV)/.deps
	@echo "== clang-tidy (csrc/core, $(TIDY_JOBS) jobs)"
	@cmake -S . -B $(LINT_BUILD_DIR) -DHVDTORCH_BUILD_TESTS=OFF -DHVDTORCH_CUDA=OFF >/dev/null
	@set -o pipefail; $(RUN_CLANG_TIDY) -quiet -j $(TIDY_JOBS) -p $(LINT_BUILD_DIR) '/csrc/core/.*\.cc$$' 2>&1 \
	  | { grep -vE '^[0-9]+ warnings? generated\.$$|^$$' || true; }

format: $(VENV)/.deps
	@echo "== clang-format -i (csrc)"
	@$(CLANG_FORMAT) -i $(CXX_FILES)
	@echo "== ruff: sort imports, format"
	@$(RUFF) check --select I --fix -q .
	@$(RUFF) format -q .

clean:
	rm -rf build hvdtorch/_C*.so *.egg-info

# make        set up .venv (torch 2.13.0 CPU + deps) and build hvdtorch (incremental)
# make test   C++ unit tests (ctest) + Python multi-process tests (pytest)
# make demo   the main job: multi-process training on CPU through torchrun
# make mutants  mutation testing: every mutation in tools/mutants.toml must fail its tests (not part of make test)
# make sanitize the C++ unit tests under ASan+UBSan (build/asan) and TSan (build/tsan)
# make test-asan-py  the simulated-device Python tests with the extension under ASan+UBSan
# make fuzz     long fuzzing: many seeds of op sequences, and the control-plane decoder for FUZZ_SECONDS
# make soak     20,000 DistributedModel steps and 1,000 init()/shutdown() cycles, nothing may grow
# make bench-training  hvdtorch vs Horovod 0.28.1, DDP and solo, training img/s under mpirun and torchrun (not part of make test)
# make bench-cluster   the same across emulated hosts (network namespaces, links shaped by tc; root), CLUSTER_ARGS for options
# make test-cuda-build  the CUDA build against torch 2.14.1 in .venv-cuda (no GPU needed), then its checks and tests
# make gpu-check PHASE=tests|bench|bench-training OUT=<dir>  on a GPU machine: build, CUDA suites and memcheck, GPU tests; GPU benchmarks

# make lint   clang-format check, ruff check, ruff format check, clang-tidy on csrc/core
# make format apply clang-format (csrc) and ruff's import sorting and formatter
# make docs   rewrite the generated parts of README.md and docs/ (knob table, file map) from the code
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export MAX_JOBS ?= 2
# ccache rewrites paths below the tree into relative ones, so a build of the same sources in another
# folder of the tree (the sdist check's, the mutants' scratch tree) reuses the objects of `make build`.
export CCACHE_BASEDIR ?= $(CURDIR)
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

.PHONY: cuda-build test-cuda-build gpu-check gpu-wheels
.PHONY: all build test test-cpp test-py test-fuzz-wire demo bench-training bench-cluster mutants sanitize fuzz soak scale test-asan test-tsan test-asan-py clean system-deps lint \
        format docs lint-clang-format lint-ruff lint-ruff-format lint-clang-tidy

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

# HVDTORCH_BUILD_TESTS: the C++ unit tests too (ctest in $(BUILD_DIR)); a user's install leaves them out.
build: $(VENV)/.deps
	HVDTORCH_BUILD_TESTS=1 $(PIP) install -q --disable-pip-version-check --no-build-isolation --no-deps -e .

test-cpp: build
	cd $(BUILD_DIR) && ctest --output-on-failure --timeout 300

test-py: build $(VENV)/.ray
	$(PY) -m pytest -q --durations=15 $(PYTEST_ARGS) tests

# Ray for tests/test_ray.py (about 500 MB). If it cannot be installed here,
# say so: the test then skips, naming the reason.
$(VENV)/.ray: requirements-ray.txt $(VENV)/.deps
	@if $(PIP) install -q --disable-pip-version-check --no-deps -r requirements-ray.txt; then touch $@; \
	else echo "make: Ray could not be installed; tests/test_ray.py will skip"; fi

test: test-cpp test-fuzz-wire test-py

# ---- the CUDA build (CI runs it; no GPU needed) -------------------------------------
# A second venv with the CUDA 13 build of torch 2.14.1 (C++20 headers) and torchvision,
# hvdtorch installed into it as a user installs it (not editable: the tree's hvdtorch/_C
# belongs to .venv), its CUDA device compiled by nvcc and linked. The tests then run from a
# copy of tests/, examples/ and benchmarks/ that holds no hvdtorch/, so they import the
# installed package. CUDA_TESTS: the build's own facts, the torchvision-dependent tests (the
# GoogLeNet comparison, ImageFolder, the training benchmark, Horovod-style example scripts),
# and of the CPU suite what exercises every collective and dtype, every reducer on two
# topologies (two hosts of two ranks; four hosts) and DistributedModel
# training equal to one process through this build, and the device paths of this build's torch
# adapter (its CUDA code compiled in) through the simulated device. The rest of the CPU suite (the same
# Python code against the other torch) runs in `make test`: all of it here would add about
# 12 minutes on 2 cores, and CI's whole run must stay under 35.
CUDA_VENV ?= .venv-cuda
CUDA_PY := $(CUDA_VENV)/bin/python
CUDA_BUILD_DIR := build/cmake-cuda
CUDA_STAGE := build/cuda-stage
CUDA_TESTS ?= tests/test_build.py tests/test_check.py tests/test_workloads.py tests/test_horovod_examples.py \
              tests/test_collectives.py "tests/test_reducers.py::test_every_reducer_on_topology[aabb]" \
              "tests/test_reducers.py::test_every_reducer_on_topology[abcd]" \
              tests/test_training.py::test_distributed_model_equals_single_process \
              tests/test_device_errors.py "tests/test_sim_device_mode.py::test_through_the_simulated_device[collectives.check_all]"

$(CUDA_VENV)/.deps: requirements-cuda.txt $(VENV)/.system-deps
	@test -x $(CUDA_PY) || python3 -m venv $(CUDA_VENV)
	$(CUDA_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-cuda.txt
	@touch $@

cuda-build: $(CUDA_VENV)/.deps
	HVDTORCH_BUILD_DIR=$(CURDIR)/$(CUDA_BUILD_DIR) $(CUDA_VENV)/bin/pip install -q --disable-pip-version-check \
	  --no-build-isolation --no-deps .

test-cuda-build: cuda-build
	rm -rf $(CUDA_STAGE) && mkdir -p $(CUDA_STAGE)
	tar -c --exclude=__pycache__ --exclude=benchmarks/results tests examples benchmarks pyproject.toml \
	  | tar -x -C $(CUDA_STAGE)
	cd $(CUDA_STAGE) && $(CURDIR)/$(CUDA_PY) -m hvdtorch.check
	cd $(CUDA_STAGE) && $(CURDIR)/$(CUDA_PY) -m pytest -q $(PYTEST_ARGS) $(CUDA_TESTS)

# ---- the GPU machine ------------------------------------------------------------
# On a machine with a GPU (its plain python3 holding a CUDA torch): build, the
# device and engine suites on cuda:0, the GPU tests, the GPU benchmarks; logs,
# CSV and plots under OUT. tools/gpu_check.py says what runs.
# PHASE=tests or bench (each a few minutes); ONLY=step,step reruns some steps;
# REUSE_BUILD=1 takes the tree's build for this python3 where it imports;
# REHEARSE=1 runs the benchmark scripts on the CPU where no GPU is visible.
# The GPU machine has Python 3.12 and no package registry: `make gpu-wheels` downloads Lightning's
# wheels (requirements-lightning.txt, and what `import lightning` needs beyond torch) for it into
# build/gpu-wheels, which a device call carries; gpu-check installs those its Python lacks.
GPU_WHEELS := build/gpu-wheels
gpu-wheels: $(VENV)/.deps
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	grep -v '^#' requirements-lightning.txt | sed 's/ .*//' > $(GPU_WHEELS)/lightning.txt
	$(PY) -c 'import importlib.metadata as m; print("\n".join(f"{p}=={m.version(p)}" for p in ("packaging", "tqdm", "fsspec", "typing_extensions")))' >> $(GPU_WHEELS)/lightning.txt
	$(PIP) download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
	  -d $(GPU_WHEELS) -r $(GPU_WHEELS)/lightning.txt

PHASE ?= tests
ONLY ?=
BUDGET ?= 330
gpu-check:
	@test -n "$(OUT)" || { echo "usage: make gpu-check PHASE=tests|bench|bench-training OUT=<dir> [ONLY=step,...]"; exit 2; }
	python3 tools/gpu_check.py --phase $(PHASE) --out $(OUT) --budget $(BUDGET) \
	  $(if $(ONLY),--only $(ONLY)) $(if $(filter 1,$(REUSE_BUILD)),--reuse-build) $(if $(filter 1,$(REHEARSE)),--rehearse)

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

# The multi-process Python tests through the simulated device (tests/test_sim_device_mode.py,
# tests/test_device_errors.py) with the extension itself built under ASan+UBSan. It is built in a
# copy of the tree (build/asan-py/tree: the tracked and new files, timestamps kept) so the working
# build stays as it is. Python is not instrumented: the ASan runtime and libstdc++ are preloaded
# (ASan must come first, and finds C++ exceptions' __cxa_throw only if libstdc++ is loaded by then),
# and leak checking is off (the interpreter and torch keep memory until exit). Not part of CI
# (about 6 minutes on 2 cores).
ASAN_PY := build/asan-py
test-asan-py: $(VENV)/.deps
	rm -rf $(ASAN_PY)/tree && mkdir -p $(ASAN_PY)/tree
	git ls-files -z --cached --others --exclude-standard | xargs -0 cp -p --parents -t $(ASAN_PY)/tree
	cd $(ASAN_PY)/tree && HVDTORCH_SANITIZE=address,undefined HVDTORCH_BUILD_DIR=$(CURDIR)/$(ASAN_PY)/cmake \
	  CCACHE_BASEDIR=$(CURDIR)/$(ASAN_PY)/tree $(CURDIR)/$(PY) setup.py -q build_ext --inplace >/dev/null
	cd $(ASAN_PY)/tree && LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libstdc++.so)" \
	  ASAN_OPTIONS=detect_leaks=0 $(CURDIR)/$(PY) -m pytest -q tests/test_sim_device_mode.py tests/test_device_errors.py

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

# Across emulated hosts (benchmarks/cluster.py: 2 hosts x 2 ranks, 10gbit, 1gbit and
# 100mbit links by default; about 15 minutes on 2 cores). Horovod is built first where
# it can be (cached); where it cannot, the benchmark leaves it out and says so.
CLUSTER_ARGS ?=
bench-cluster: build
	benchmarks/peers/build_horovod.sh || echo "bench-cluster: Horovod could not be built; it is left out"
	$(PY) benchmarks/cluster.py $(CLUSTER_ARGS)

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

docs: build
	$(PY) tools/gen_docs.py

clean:
	rm -rf build hvdtorch/_C*.so *.egg-info

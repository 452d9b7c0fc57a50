#!/usr/bin/env bash
# Builds Horovod 0.28.1, the peer the benchmarks measure against, from its
# PyPI sdist into a venv of its own (build/horovod-venv, git-ignored; never
# used by make test): CPU only, with MPI and Gloo, against the same pinned
# torch as hvdtorch. Cached: a second run that finds a working build does
# nothing. About 12 minutes on 2 cores.
#
#   benchmarks/peers/build_horovod.sh            # then:
#   build/horovod-venv/bin/python -c "import horovod.torch as hvd"
#
# Horovod 0.28.1's CMake builds its PyTorch extension as C++14, and torch
# >= 2.1 needs C++17. The patch below is the one Horovod's later sources
# carry: the PyTorch extension is compiled as C++17 and linked against a
# copy of Gloo compiled as C++17 (compatible17_gloo), with the C++ ABI
# torch was built with.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
venv=${HOROVOD_VENV:-$here/build/horovod-venv}
version=0.28.1
py=$venv/bin/python

# What the benchmark ranks import besides torch and Horovod (the pins of
# requirements-dev.txt): tqdm for progress bars, Pillow for --data.
bench_deps() {
  "$venv/bin/pip" install -q --disable-pip-version-check tqdm==4.70.1 pillow
}

if [ -x "$py" ] && "$py" -c "import horovod.torch as h; assert h.mpi_built() and h.gloo_built()" 2>/dev/null; then
  bench_deps
  echo "horovod $version: already built in $venv"
  exit 0
fi

python3 -m venv "$venv"
# Exact torch pin (the CPU build), as hvdtorch's requirements-dev.txt; Horovod's
# own dependencies without letting pip choose another torch.
"$venv/bin/pip" install -q --disable-pip-version-check torch==2.13.0 numpy mpi4py
"$venv/bin/pip" install -q --disable-pip-version-check cloudpickle psutil pyyaml packaging cffi
bench_deps

src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
"$venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: "horovod==$version" -d "$src"
tar xzf "$src/horovod-$version.tar.gz" -C "$src"
tree=$src/horovod-$version

# C++17 for the PyTorch extension, linked against the C++17 Gloo.
sed -i 's/    set(CMAKE_CXX_STANDARD 14)/    set(CMAKE_CXX_STANDARD 17)/' "$tree/horovod/torch/CMakeLists.txt"
sed -i 's/        list(APPEND PYTORCH_LINKER_LIBS gloo)/        list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)/' \
  "$tree/horovod/torch/CMakeLists.txt"
sed -i 's/^if(HAVE_GLOO AND (DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17))/if(HAVE_GLOO AND ((DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17) OR (DEFINED Pytorch_CXX11 AND Pytorch_CXX11)))/' \
  "$tree/CMakeLists.txt"
sed -i 's/^    if (Tensorflow_CXX11)$/    if (Tensorflow_CXX11 OR Pytorch_CXX11)/' "$tree/CMakeLists.txt"
grep -q "set(CMAKE_CXX_STANDARD 17)" "$tree/horovod/torch/CMakeLists.txt"
grep -q "compatible17_gloo)" "$tree/horovod/torch/CMakeLists.txt"
grep -q "Pytorch_CXX11 AND Pytorch_CXX11" "$tree/CMakeLists.txt"

HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS="-j${MAX_JOBS:-2}" \
  "$venv/bin/pip" install --disable-pip-version-check --no-build-isolation --no-deps "$tree"

"$py" -c "import horovod, horovod.torch as h; assert h.mpi_built() and h.gloo_built(); print('horovod', horovod.__version__, 'mpi', h.mpi_built(), 'gloo', h.gloo_built())"

#!/usr/bin/env bash
# A/B benchmark of two built checkouts of hvdtorch (say, before and after a
# change), interleaved so that both see the same machine state:
#
#   benchmarks/ab.sh OLD_TREE NEW_TREE [ROUNDS]
#
# Each round runs, from each tree in turn, the all-reduce benchmark (2 ranks
# under mpirun, 4 KiB .. 16 MiB, every reducer, Gloo and MPI in the same job)
# and the GoogLeNet training benchmark (2 ranks under torchrun, comm-heavy
# and compute-heavy settings, solo and auto:P+F). Both trees must be built in
# place (python setup.py build_ext --inplace, or make build). Results go to
# benchmarks/results/ab/<tree name>.<round>/; benchmarks/ab_summary.py
# prints the medians of each side and their ratio.
set -euo pipefail
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
rounds=${3:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
out=$here/benchmarks/results/ab
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  for tree in "$old" "$new"; do
    side=$([ "$tree" = "$old" ] && echo old || echo new)
    dir=$out/$side.$round
    mkdir -p "$dir"
    echo "== round $round: $side ($tree)"
    (cd "$tree" && PYTHONPATH=$tree "$py" benchmarks/allreduce.py --ranks 2 --max-bytes 16M --reps 5 \
       --out "$dir" | tail -n 12)
    for setting in comm compute; do
      (cd "$tree" && OMP_NUM_THREADS=1 PYTHONPATH=$tree "$py" -m torch.distributed.run --nproc_per_node=2 \
         benchmarks/googlenet.py --setting "$setting" --configs solo,auto:P+F --rounds 1 --iters 12 --out "$dir" \
         2>&1 | grep img/s)
    done
  done
done
"$py" "$here/benchmarks/ab_summary.py" "$out"

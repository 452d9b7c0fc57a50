#!/usr/bin/env bash
# The training table: hvdtorch against Horovod 0.28.1, DDP (Gloo) and solo, in
# one job per (launcher, setting, world size), interleaved rounds, medians with
# min-max (see benchmarks/googlenet.py for the method). Not part of make test.
#
#   benchmarks/run_training.sh [--rounds 5] [--iters 12] [--warmup 3] [--ranks "2 3 4"]
#                              [--settings "comm compute"] [--launchers "mpirun torchrun"] [--data DIR]
#   make bench-training ROUNDS=5 ITERS=12
#
# Horovod runs under mpirun only: its MPI operations cannot join a torchrun
# job. It needs benchmarks/peers/build_horovod.sh (build/horovod-venv); the
# ranks of both launchers then run that venv's Python (same torch pin) with
# this tree on PYTHONPATH, so both launchers measure the same interpreter.
# Without it, the table is made without Horovod, and says so.
# Results: benchmarks/results/training/<launcher>/<setting>.jsonl and table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=5; ITERS=12; WARMUP=3; RANKS="2 3 4"; SETTINGS="comm compute"; LAUNCHERS="mpirun torchrun"; DATA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --warmup) WARMUP="$2"; shift 2 ;;
    --ranks) RANKS="$2"; shift 2 ;;
    --settings) SETTINGS="$2"; shift 2 ;;
    --launchers) LAUNCHERS="$2"; shift 2 ;;
    --data) DATA=(--data "$2"); shift 2 ;;
    *) echo "run_training.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$PWD
HOROVOD_PY=build/horovod-venv/bin/python
if [ -x "$HOROVOD_PY" ] && "$HOROVOD_PY" -c "import horovod.torch" 2>/dev/null; then
  PY=$HOROVOD_PY; HOROVOD=horovod,
else
  PY=${PY:-.venv/bin/python}; HOROVOD=
  echo "run_training.sh: no Horovod (run benchmarks/peers/build_horovod.sh): the table has no Horovod column" >&2
fi
OUT=benchmarks/results/training
for launcher in $LAUNCHERS; do
  mkdir -p "$OUT/$launcher"
  for setting in $SETTINGS; do
    rm -f "$OUT/$launcher/$setting.jsonl"
    for n in $RANKS; do
      args=(benchmarks/googlenet.py --setting "$setting" --rounds "$ROUNDS" --iters "$ITERS" --warmup "$WARMUP"
            --out "$OUT/$launcher" ${DATA[@]+"${DATA[@]}"})
      echo "== $setting, $n rank(s), $launcher"
      case "$launcher" in
        mpirun) mpirun --oversubscribe -np "$n" -x OMP_NUM_THREADS -x PYTHONPATH \
                  "$PY" "${args[@]}" --configs "auto:P+F,${HOROVOD}ddp,solo" ;;
        torchrun) [ -n "$HOROVOD" ] && echo "   (Horovod: mpirun only, its MPI operations cannot join a torchrun job)"
                  "$PY" -m torch.distributed.run --nproc_per_node="$n" "${args[@]}" --configs auto:P+F,ddp,solo ;;
        *) echo "run_training.sh: unknown launcher $launcher" >&2; exit 2 ;;
      esac
    done
  done
done
"$PY" benchmarks/training_table.py "$OUT" | tee "$OUT/table.md"

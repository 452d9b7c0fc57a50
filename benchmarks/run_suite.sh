#!/usr/bin/env bash
# GoogLeNet benchmark suite: settings compute / small / comm at 1..4 ranks,
# the fusion sweep at 2 ranks, then the plots and tables. The benchmark script
# is the same under both launchers.
#   benchmarks/run_suite.sh torchrun|mpirun [--data DIR] [--ranks "1 2 3 4"] [--settings "compute small comm fusion"]
#                          [--rounds R] [--iters N] [--configs LIST]
# benchmarks/googlenet.py's options pass through; the configurations default to
# every reducer with P+F, the P/F ablation of auto, DDP and solo. The
# headline table against Horovod is benchmarks/run_training.sh.
# Only the settings named are (re)measured; results of the others are kept.
# Results: benchmarks/results/<launcher>/{compute,small,comm,fusion}.jsonl, *.png, summary.md
set -euo pipefail
cd "$(dirname "$0")/.."
LAUNCHER=${1:?usage: run_suite.sh torchrun|mpirun [options]}; shift
PY=${PY:-.venv/bin/python}
RANKS="1 2 3 4"; SETTINGS="compute small comm fusion"; EXTRA=()
CONFIGS=solo,ddp,auto:P+F,node:P+F,ring:P+F,central:P+F,native:P+F,auto:none,auto:P,auto:F
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) RANKS="$2"; shift 2 ;;
    --settings) SETTINGS="$2"; shift 2 ;;
    --configs) CONFIGS="$2"; shift 2 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

launch() {  # launch N args...: run benchmarks/googlenet.py on N ranks
  local n=$1; shift
  case "$LAUNCHER" in
    torchrun) "$(dirname "$PY")/torchrun" --nproc_per_node="$n" benchmarks/googlenet.py "$@" ;;
    mpirun) mpirun --oversubscribe -np "$n" -x OMP_NUM_THREADS "$PY" benchmarks/googlenet.py "$@" ;;
    *) echo "unknown launcher $LAUNCHER" >&2; exit 2 ;;
  esac
}

OUT=benchmarks/results/$LAUNCHER
mkdir -p "$OUT"
for setting in $SETTINGS; do
  [ "$setting" = fusion ] && continue
  rm -f "$OUT/$setting.jsonl"
  for n in $RANKS; do
    echo "== $setting, $n rank(s), $LAUNCHER"
    launch "$n" --setting "$setting" --configs "$CONFIGS" --out "$OUT" ${EXTRA[@]+"${EXTRA[@]}"}
  done
done
if [[ " $SETTINGS " == *" fusion "* ]]; then
  echo "== fusion sweep (comm setting, 2 ranks, P+F, auto reducer)"
  SWEEP=$(for b in 262144 1048576 4194304 16777216 67108864 134217728; do printf "auto:%s," "$b"; done)
  rm -rf "$OUT/sweep"; mkdir -p "$OUT/sweep"
  launch 2 --setting comm --configs "${SWEEP%,}" --out "$OUT/sweep" ${EXTRA[@]+"${EXTRA[@]}"}
  mv "$OUT/sweep/comm.jsonl" "$OUT/fusion.jsonl"; rmdir "$OUT/sweep"
fi
"$PY" benchmarks/plot.py "$OUT"

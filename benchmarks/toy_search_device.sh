#!/usr/bin/env bash
# The reasoning toy's design search (python -m verl_ext.toy.search, docs/toy.md "Design search") on a lent machine:
# run from the repository root, python3 with torch and transformers (no verl needed), results under $OUT:
#   $OUT/summary.json  every cell's record and criteria a/b/c, rewritten as each unit finishes
#   $OUT/search.log    the search's progress, then the per-cell table
# The device tool copies the main checkout: merge this script and verl_ext/toy/search.py there first.
# Settings (environment): JOBS (default 16), DEADLINE (seconds, default 520: the summary is written before a
# 600-second command limit), UNIT_TIMEOUT (default 500), DEVICE (cpu; cuda runs every unit on the GPU), CELLS (the
# cell list; default below), EXTRA (more options, e.g. "--quick" for a smoke run).
set -u
: "${OUT:?set OUT to the folder the results go to}"
PY=${PYTHON:-python3}
JOBS=${JOBS:-16}
DEADLINE=${DEADLINE:-520}
UNIT_TIMEOUT=${UNIT_TIMEOUT:-500}
DEVICE=${DEVICE:-cpu}
# Estimated single-core seconds per cell (warm-up + 7 figure measurements + 6 controls of 60 steps), scaled from the
# toy's 80 s warm-up on one core: h64l2 ~190, h128l2 ~290, h128l4 ~480 (its critical path: warm-up ~200 s, then one
# control ~50 s). 16 cells ~4800 core-seconds: ~300-350 s on 16 cores.
DEFAULT_CELLS="chain6/h64l2 chain6_seen/h64l2 twodigit/h64l2 twodigit3/h64l2
chain6/h128l2 chain6_seen/h128l2 twodigit/h128l2 twodigit3/h128l2
chain6/h128l4 chain6_seen/h128l4 twodigit/h128l4 twodigit3/h128l4
chain6_seen@0.01/h64l2 twodigit@0.02/h64l2 chain6_seen@0.01/h128l2 twodigit@0.02/h128l2"
CELLS=${CELLS:-$DEFAULT_CELLS}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/toy_search.XXXXXX")
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
mkdir -p "$OUT"
{
  echo "[toy_search_device] $(date -u +%FT%TZ) $(nproc --all) cores; $("$PY" -c 'import sys, torch, transformers; print(sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1)"
  grep -m1 "model name" /proc/cpuinfo || true
  # shellcheck disable=SC2086
  "$PY" -m verl_ext.toy.search --cells $CELLS --jobs "$JOBS" --out "$WORK" --summary "$OUT/summary.json" \
    --deadline "$DEADLINE" --unit-timeout "$UNIT_TIMEOUT" --device "$DEVICE" ${EXTRA:-}
  echo "[toy_search_device] search exit code $?"
  [ -f "$OUT/summary.json" ] && "$PY" -m verl_ext.toy.search --table "$OUT/summary.json"
} 2>&1 | grep --line-buffered -v -e "Loading weights" -e "Writing model shards" | tee "$OUT/search.log"
rm -rf "$WORK"

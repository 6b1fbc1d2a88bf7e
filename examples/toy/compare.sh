#!/usr/bin/env bash
# The side-by-side on the embedded CPU task: every METHOD x SEED with ./train.sh (same seeds for every method), then
# one report over all of them (python -m verl_ext.report --by-method: a row per method, mean over seeds; PNGs), and
# each run's last checkpoint measured per data source as the build measures step 0 (python -m verl_ext.toy --figures:
# accuracy, length, token entropy, empty replies; <run>/end_figures.json; the reasoning task only).
# Runs are seeded (data order, the hf rollout's sampling, GEC's branch draws), so seeds pair the methods.
#   METHODS  default "grpo eda grpo_gec edge_grpo gepo edge_grpo_guard": GRPO (GEC off), EDA alone, GEC alone on
#            GRPO, EDGE-GRPO (EDA + GEC), GEPO, and EDGE-GRPO with the degenerate-edit guard (examples/common.sh)
#   SEEDS    default "1 2 3"
#   JOBS     runs at a time, default 1 (one lane per seed: a lane runs its seed's methods one after another)
#   LAST     training steps averaged in the report's table, default 20
#   VAL_EVERY  validation every this many steps (trainer.test_freq), default 20: the curves show the trajectory
#   STEPS, DRY_RUN, PYTHON, OUTPUT_ROOT, WANDB_API_KEY: as ./train.sh. Extra arguments go to every run.
# Runs land in $OUTPUT_ROOT/verl_ext_toy/toy_<method>_seed<seed>, the report in $OUTPUT_ROOT/verl_ext_toy/compare.
# A failed run does not stop the others; the script exits non-zero at the end, naming them.
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
source "$here/../common.sh"

METHODS="${METHODS:-grpo eda grpo_gec edge_grpo gepo edge_grpo_guard}"
SEEDS="${SEEDS:-1 2 3}"
JOBS="${JOBS:-1}"
LAST="${LAST:-20}"
VAL_EVERY="${VAL_EVERY:-20}"
[[ -z "${RUN_DIR:-}" ]] || vx_die "RUN_DIR is per run; set OUTPUT_ROOT for a comparison"
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || vx_die "JOBS must be a positive integer, not '$JOBS'"
for method in $METHODS; do vx_method "$method"; done  # an unknown method stops here, before any run

failed_dir="$(mktemp -d)"
trap 'rm -rf "$failed_dir"' EXIT
lane() {  # one seed's methods, one after another
    local seed="$1" method
    shift
    for method in $METHODS; do
        echo "=== compare: METHOD=$method SEED=$seed" >&2
        METHOD="$method" SEED="$seed" "$here/train.sh" "trainer.test_freq=$VAL_EVERY" "$@" \
            || touch "$failed_dir/METHOD=$method SEED=$seed"
    done
}
running=0
for seed in $SEEDS; do
    if ((JOBS > 1)); then
        lane "$seed" "$@" &
        running=$((running + 1))
        if ((running >= JOBS)); then wait -n || true; running=$((running - 1)); fi
    else
        lane "$seed" "$@"
    fi
done
wait

vx_dry_run && exit 0
runs=()
for seed in $SEEDS; do
    for method in $METHODS; do
        d="$(vx_abspath "$OUTPUT_ROOT/verl_ext_toy/toy_${method}_seed${seed}")"
        [[ -e "$d/metrics.jsonl" ]] && runs+=("$d")
    done
done
((${#runs[@]})) || vx_die "no run wrote metrics"
toy_task=""  # the default toy's, unless +toy=... names another
for arg in "$@"; do [[ "$arg" != +toy=* ]] || toy_task="${arg#+toy=}"; done
if [[ "$toy_task" != add ]]; then  # the figures are the reasoning tasks'
    for d in "${runs[@]}"; do
        latest="$d/checkpoints/latest_checkpointed_iteration.txt"
        [[ -e "$latest" ]] || continue
        "$PYTHON" -m verl_ext.toy ${toy_task:+--task "$toy_task"} --figures "$d/checkpoints/global_step_$(cat "$latest")" --json \
            | tail -n 1 \
            > "$d/end_figures.json" || echo "$(basename "$0"): no figures for $d" >&2
    done
fi
"$PYTHON" -m verl_ext.report "${runs[@]}" --by-method --last "$LAST" -o "$(vx_abspath "$OUTPUT_ROOT/verl_ext_toy/compare")"

failed=("$failed_dir"/*)
if [[ -e "${failed[0]}" ]]; then
    echo "$(basename "$0"): ${#failed[@]} run(s) failed: $(for f in "${failed[@]}"; do printf '%s; ' "$(basename "$f")"; done)" >&2
    exit 1
fi

#!/usr/bin/env bash
# A sweep on the embedded CPU task: ./train.sh for every METHOD x SEED, one after another (each its own RUN_DIR,
# outputs/verl_ext_toy/toy_<method>_seed<seed>; ~9 minutes per run of 150 steps on 2 cores). A failed run does not
# stop the sweep; the sweep exits non-zero at the end, naming the failed runs.
#   METHODS  default "grpo edge_grpo gepo" (any of examples/common.sh's methods)
#   SEEDS    default "1 2 3"
#   STEPS, DRY_RUN, PYTHON, OUTPUT_ROOT, WANDB_API_KEY: as ./train.sh. Extra arguments go to every run.
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"

METHODS="${METHODS:-grpo edge_grpo gepo}"
SEEDS="${SEEDS:-1 2 3}"
[[ -z "${RUN_DIR:-}" ]] || { echo "$(basename "$0"): RUN_DIR is per run; set OUTPUT_ROOT for a sweep" >&2; exit 2; }

failed=()
for seed in $SEEDS; do
    for method in $METHODS; do
        echo "=== sweep: METHOD=$method SEED=$seed" >&2
        METHOD="$method" SEED="$seed" "$here/train.sh" "$@" || failed+=("METHOD=$method SEED=$seed")
    done
done
if ((${#failed[@]})); then
    echo "$(basename "$0"): ${#failed[@]} run(s) failed: $(IFS=';'; echo "${failed[*]}")" >&2
    exit 1
fi

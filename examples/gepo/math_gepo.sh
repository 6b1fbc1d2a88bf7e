#!/usr/bin/env bash
# GEPO, thresholds from the whole batch (the paper's),
# on a math model (Qwen2.5-Math-7B by default, DeepScaleR-hard-1k, boxed-math reward).
# Variables (MODEL, TRAIN_FILE, VAL_DIR, N_GPUS, DRY_RUN, ...) and extra Hydra overrides: ./train.sh
set -euo pipefail
TASK=math METHOD=gepo exec "$(dirname "${BASH_SOURCE[0]}")/train.sh" "$@"

#!/usr/bin/env bash
# GEPO, thresholds per data_source (stats_scope=per_data_source),
# on a task mixture (MODEL, TRAIN_FILES, VAL_FILES required).
# Variables (REWARD_PATH, EPOCHS, N_GPUS, DRY_RUN, ...) and extra Hydra overrides: ./train.sh
set -euo pipefail
TASK=mixture METHOD=gepo_per_source exec "$(dirname "${BASH_SOURCE[0]}")/train.sh" "$@"

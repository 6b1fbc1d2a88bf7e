#!/usr/bin/env bash
# EDGE-GRPO paper, Qwen2.5-Math-7B: +Force-R & EDA (Force-R with the entropy-driven advantage).
# Variables (BATCH=throughput|paper, TRAIN_FILE, VAL_DIR, N_GPUS, DRY_RUN, ...) and extra Hydra overrides: ../train.sh
set -euo pipefail
ROW=force_r_eda MODEL="${MODEL:-Qwen/Qwen2.5-Math-7B}" exec "$(dirname "${BASH_SOURCE[0]}")/../train.sh" "$@"

#!/usr/bin/env bash
# EDGE-GRPO paper, Qwen2.5-Math-7B: EDGE-GRPO (GEC + EDA).
# Variables (BATCH=throughput|paper, TRAIN_FILE, VAL_DIR, N_GPUS, DRY_RUN, ...) and extra Hydra overrides: ../train.sh
set -euo pipefail
ROW=edge_grpo MODEL="${MODEL:-Qwen/Qwen2.5-Math-7B}" exec "$(dirname "${BASH_SOURCE[0]}")/../train.sh" "$@"

#!/usr/bin/env bash
# EDGE-GRPO paper, Qwen2.5-Math-1.5B: +Force-R (GRPO; every wrong response gets the cue and a continuation).
# Variables (BATCH=throughput|paper, TRAIN_FILE, VAL_DIR, N_GPUS, DRY_RUN, ...) and extra Hydra overrides: ../train.sh
set -euo pipefail
ROW=force_r MODEL="${MODEL:-Qwen/Qwen2.5-Math-1.5B}" exec "$(dirname "${BASH_SOURCE[0]}")/../train.sh" "$@"

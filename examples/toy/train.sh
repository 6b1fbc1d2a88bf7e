#!/usr/bin/env bash
# One run on the embedded CPU task (hydra_configs/toy_cpu.yaml: the tiny model learns step-by-step additions on verl's
# real pipeline, 60 steps; model, tokenizer and data are built once and cached, see README).
#   METHOD  grpo | force_r | force_r_eda | edge_grpo (default) | eda | gepo | gepo_per_source (examples/common.sh)
#   STEPS   training steps, default 60 (validation at step 0 and at the last step; a checkpoint at the last step)
#   + common.sh's: DRY_RUN, PYTHON, SEED, OUTPUT_ROOT, RUN_DIR, WANDB_API_KEY. Extra arguments are Hydra overrides
#   and go last, e.g. trainer.use_v1=true. No GPU: trainer.device=cpu (the toy config's) runs verl on CPU.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

METHOD="${METHOD:-edge_grpo}"
STEPS="${STEPS:-60}"

vx_method "$METHOD"
vx_run_overrides verl_ext_toy "toy_${METHOD}_seed${SEED}"

vx_launch --config-name toy_cpu \
    "${METHOD_OVERRIDES[@]}" \
    "trainer.total_training_steps=$STEPS" \
    "${RUN_OVERRIDES[@]}" \
    "$@"

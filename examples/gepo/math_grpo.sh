#!/usr/bin/env bash
# GEPO paper (arXiv 2607.16850) comparison: GRPO, the baseline,
# on a math model: Qwen2.5-Math-7B by default, DeepScaleR-hard-1k and the five suites, boxed-math reward
# (data: python -m verl_ext.data.deepscaler / eval_suites, as examples/edge_grpo).
# Variables with their defaults (EPOCHS, MAX_RESPONSE_LENGTH, N_GPUS, ...): ./defaults.sh; DRY_RUN=1 prints the
# checked config and trains nothing. Extra arguments are Hydra overrides and go last.
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen2.5-Math-7B}"
source "$(dirname "${BASH_SOURCE[0]}")/defaults.sh"
gepo_math_data  # TRAIN_FILES, VAL_FILES from TRAIN_FILE / VAL_DIR
vx_run_overrides verl_ext_gepo "math_grpo_$(vx_model_tag "$MODEL")_seed${SEED}"  # names, loggers, paths, seed

vx_launch --config-name gepo_paper \
    algorithm.adv_estimator=grpo \
    algorithm.gec.enable=false \
    actor_rollout_ref.model.path="$MODEL" \
    data.train_files="[$TRAIN_FILES]" \
    data.val_files="[$VAL_FILES]" \
    data.max_response_length="$MAX_RESPONSE_LENGTH" \
    reward.custom_reward_function.path=pkg://verl_ext.rewards.math \
    reward.custom_reward_function.name=compute_score \
    +reward.custom_reward_function.reward_kwargs.scale=original \
    trainer.total_epochs="$EPOCHS" \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.test_freq="$TEST_FREQ" \
    trainer.save_freq="$SAVE_FREQ" \
    "${RUN_OVERRIDES[@]}" \
    "$@"

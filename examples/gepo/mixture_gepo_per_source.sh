#!/usr/bin/env bash
# GEPO paper (arXiv 2607.16850) comparison: GEPO, thresholds per data_source (an extension: stats_scope=per_data_source),
# on a task mixture: MODEL, TRAIN_FILES, VAL_FILES required (one data_source per task); REWARD_PATH optional.
# Variables with their defaults (EPOCHS, MAX_RESPONSE_LENGTH, N_GPUS, ...): ./defaults.sh; DRY_RUN=1 prints the
# checked config and trains nothing. Extra arguments are Hydra overrides and go last.
set -euo pipefail
MODEL="${MODEL:?set MODEL to the policy model (Hugging Face name or local path) for the task mixture}"
TRAIN_FILES="${TRAIN_FILES:?set TRAIN_FILES to the training parquet files of the mixture, comma-separated}"
VAL_FILES="${VAL_FILES:?set VAL_FILES to the validation parquet files of the mixture, comma-separated}"
source "$(dirname "${BASH_SOURCE[0]}")/defaults.sh"
gepo_check_data
# verl's built-in scoring per data_source unless REWARD_PATH names a custom reward for every task
REWARD=()
[[ -z "${REWARD_PATH:-}" ]] || REWARD=("reward.custom_reward_function.path=$REWARD_PATH")
vx_run_overrides verl_ext_gepo "mixture_gepo_per_source_$(vx_model_tag "$MODEL")_seed${SEED}"  # names, loggers, paths, seed

vx_launch --config-name gepo_paper \
    algorithm.adv_estimator=gepo \
    algorithm.gec.enable=false \
    algorithm.gepo.stats_scope=per_data_source \
    actor_rollout_ref.model.path="$MODEL" \
    data.train_files="[$TRAIN_FILES]" \
    data.val_files="[$VAL_FILES]" \
    data.max_response_length="$MAX_RESPONSE_LENGTH" \
    "${REWARD[@]}" \
    trainer.total_epochs="$EPOCHS" \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.test_freq="$TEST_FREQ" \
    trainer.save_freq="$SAVE_FREQ" \
    "${RUN_OVERRIDES[@]}" \
    "$@"

#!/usr/bin/env bash
# Prompt-side hints on GRPO, GHPO's scope (arXiv 2507.10628): a group whose first attempts are all wrong is
# sampled again whole with 25% of its reference solution appended to the user turn, then 50%, then 75% while it stays
# all wrong (cut at line or sentence ends: hint_rule=math); GRPO over the group as it ends, every response trained
# against its hinted prompt (docs/hints.md). GHPO appends the hint at characters' fractions; ours cuts at step ends.
# Beside the EDGE-GRPO paper's rows for Qwen/Qwen2.5-Math-7B (not a row of its Table 1): its data, batch and evaluation.
# A hint is prompt: data.max_prompt_length=1024 (the rows' 512 + room for a hint; the start-up check reads the first
# rows of TRAIN_FILE and says how many hints do not fit; at run time those are skipped and counted,
# hint/skipped/prompt_too_long). Without GEC's edits nothing caps the first generation: max_response_length 1024.
# Data first: python -m verl_ext.data.deepscaler --input deepscaler_hard-1k.json --output data/train
#             python -m verl_ext.data.eval_suites --input evaluation_suite --output data/eval
# Variables with their defaults (MODEL, TRAIN_FILE, VAL_DIR, BATCH, N_GPUS, ...): ../defaults.sh; DRY_RUN=1 prints
# the checked config and trains nothing. Extra arguments are Hydra overrides and go last.
# Afterwards: python -m verl_ext.evaluate --model $MODEL --checkpoint $RUN_DIR/checkpoints/global_step_<last> --data $VAL_DIR
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen2.5-Math-7B}"
source "$(dirname "${BASH_SOURCE[0]}")/../defaults.sh"
vx_run_overrides verl_ext_edge_grpo "grpo_hint_all_$(vx_model_tag "$MODEL")_${BATCH}_seed${SEED}"  # names, loggers, paths, seed

vx_launch --config-name edge_grpo_paper \
    algorithm.adv_estimator=grpo \
    algorithm.gec.enable=true \
    algorithm.gec.mode=hint \
    algorithm.gec.hint_scope=all \
    algorithm.gec.hint_placement=user \
    algorithm.gec.hint_rule=math \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path="$MODEL" \
    data.train_files="$TRAIN_FILE" \
    data.val_files="[$VAL_FILES]" \
    data.train_batch_size="$TRAIN_BATCH_SIZE" \
    reward.custom_reward_function.path=pkg://verl_ext.rewards.math \
    reward.custom_reward_function.name=compute_score \
    +reward.custom_reward_function.reward_kwargs.scale=original \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.test_freq="$TEST_FREQ" \
    trainer.save_freq="$SAVE_FREQ" \
    "${RUN_OVERRIDES[@]}" \
    "$@"

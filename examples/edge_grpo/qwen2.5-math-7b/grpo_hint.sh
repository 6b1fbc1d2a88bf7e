#!/usr/bin/env bash
# Prompt-side hints on GRPO, Scaf-GRPO's scope (arXiv 2510.19807): after the warm-up, a group whose first attempts are
# all wrong gets samples with a rising prefix of its reference solution in the user turn (25%, 50%, 75% of its steps,
# cut at line or sentence ends: hint_rule=math), and the lowest level whose sample is right replaces one wrong member;
# GRPO over the mixed group, the hinted sample trained against its hinted prompt (docs/hints.md). Scaf-GRPO warms up
# 50 steps of 256 prompts (more than this data's one epoch) and uses its own 8 pre-generated hint levels: add
# algorithm.gec.hint_warmup_steps=N to hold the hints back.
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
vx_run_overrides verl_ext_edge_grpo "grpo_hint_$(vx_model_tag "$MODEL")_${BATCH}_seed${SEED}"  # names, loggers, paths, seed

vx_launch --config-name edge_grpo_paper \
    algorithm.adv_estimator=grpo \
    algorithm.gec.enable=true \
    algorithm.gec.mode=hint \
    algorithm.gec.hint_scope=one \
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

"""Rewards for the papers' tasks.

``verl_ext.rewards.math``: the boxed-math reward of EDGE-GRPO (last ``\\boxed{}``, graded with math-verify in
killable child processes), usable as verl's custom reward function
(``reward.custom_reward_function.path=pkg://verl_ext.rewards.math``).
"""

"""End to end on CPU: the real verl trainers (Ray, FSDP2 on gloo, the agent loop, the `hf` rollout) through
``python -m verl_ext.main``, 2 steps each on the embedded toy task (GEC on, as in the default)."""

from __future__ import annotations

import json

import pytest

from verl_ext.trainer.mixin import STATE_FILE

pytestmark = pytest.mark.e2e

V1 = "trainer.use_v1=true"
LEGACY = "trainer.use_v1=false"


def validation_untouched_by_gec(steps: dict) -> None:
    """The validation before training (step 0): GEC stays off for validation rollouts. The toy model never solves
    six-digit chains (toy_chain6) at the start, so their accuracy is ~0; GEC's answer and solution branches
    (half of the edits) would make about half of them right."""
    values = steps.pop(0)
    for key in ("val-core/toy_chain6/acc/mean@1", "val-core/toy_chain6@greedy/acc/mean@1"):  # sampled and greedy rows
        if key in values:  # a random subset of the held-out rows (data.val_max_samples)
            assert values[key] < 0.25, values
    assert "val-core/toy_chain6/acc/mean@1" in values, values


def trained(steps: dict) -> None:
    assert sorted(steps) == [1, 2], steps.keys()
    assert all("actor/pg_loss" in values for values in steps.values())
    # a step whose groups all share one reward has zero advantages (no update): the toy model is sure of many
    # prompts, so one such step in a short run happens; the run must have updated the actor at least once
    assert max(values["actor/grad_norm"] for values in steps.values()) > 0, steps


@pytest.mark.parametrize("estimator", ["grpo", "edge_grpo", "gepo"])
def test_v1_trainer(run_main, estimator):
    # validation once is enough (a random 300 of the held-out rows)
    validate = ["trainer.val_before_train=true", "data.val_max_samples=300"] if estimator == "edge_grpo" else []
    steps = run_main(V1, f"algorithm.adv_estimator={estimator}", *validate).metrics()
    if validate:
        validation_untouched_by_gec(steps)
    trained(steps)
    for values in steps.values():
        # GEC ran on the v1 path: responses corrected and re-scored, with any estimator
        assert values["gec/responses"] == 32 and values["gec/reward_after"] >= values["gec/reward_before"]
        # the step diagnostics, for every estimator (verl's grpo included: a baseline on the same curves)
        assert {"verl_ext/collapsed_group_frac", "verl_ext/adv_var", "verl_ext/response_entropy_mean",
                "verl_ext/response_entropy_std"} <= set(values)
        assert values["verl_ext/response_entropy_mean"] > 0
        if estimator == "grpo":  # verl's own advantage computation, untouched: none of verl_ext's estimator metrics
            assert not any(k.startswith(("edge_grpo/", "gepo/")) for k in values)
            assert "verl_ext/frac_adv_modified" not in values
            continue
        if estimator == "edge_grpo":
            assert values["edge_grpo/factor_max"] > values["edge_grpo/factor_min"]
        else:
            assert values["gepo/H_low"] <= values["gepo/H_high"]
            assert {"gepo/H_mean", "gepo/H_std", "gepo/frac_pos_attenuated", "gepo/frac_neg_attenuated"} <= set(values)
    if estimator != "grpo":  # the method changed some advantages relative to plain GRPO
        assert max(v["verl_ext/frac_adv_modified"] for v in steps.values()) > 0


def test_legacy_trainer_edge_grpo_on_two_ranks(run_main):
    # with the paper preset's linear LR decay (verl_ext/lr_schedule.py) in verl's FSDP engine on both ranks
    run = run_main(LEGACY, "algorithm.adv_estimator=edge_grpo", "trainer.n_gpus_per_node=2",
                   "ray_kwargs.ray_init.num_gpus=2", "actor_rollout_ref.actor.optim.lr_scheduler_type=linear",
                   "trainer.val_before_train=true", "data.val_max_samples=300")
    steps = run.metrics()
    validation_untouched_by_gec(steps)
    trained(steps)
    for values in steps.values():
        assert values["verl_ext/frac_adv_modified"] > 0 and "edge_grpo/factor_mean" in values
        assert values["gec/frac_edited"] > 0 and "gec/groups_rescued" in values
        # GEC's length budget: every edit fits, nothing cut
        assert values["gec/truncated"] == 0 and values["gec/count/answer_no_room"] == 0
    # verl logs the LR after the scheduler step: toy lr 1e-3 decays linearly to 0 over the 2 steps
    assert steps[1]["actor/lr"] == pytest.approx(0.5e-3) and steps[2]["actor/lr"] == pytest.approx(0.0)
    assert "hf_server_1_0" in run.output  # one rollout server per training rank: the sharded path ran


def test_gepo_history_survives_save_stop_resume(run_main, tmp_path):
    # the legacy trainer's save/stop/resume (the v1 trainer's: test_combinations' colocate_async kill-and-resume)
    per_source = "algorithm.gepo.stats_scope=per_data_source"
    first = run_main(LEGACY, "algorithm.adv_estimator=gepo", per_source, "trainer.save_freq=1")
    saved = json.loads((tmp_path / "ckpt" / "global_step_2" / STATE_FILE).read_text())["entropy_history"]
    # one update per step in which the data source had groups (a 4-prompt batch need not hold both sources)
    logged = first.metrics()[2]
    assert saved["scopes"] and max(s["num_updates"] for s in saved["scopes"].values()) == 2
    for scope, state in saved["scopes"].items():
        assert state["num_updates"] == logged[f"gepo/{scope}/history_updates"] >= 1, (scope, state, logged)

    resumed = run_main(LEGACY, "algorithm.adv_estimator=gepo", per_source, "trainer.save_freq=1",
                       "trainer.total_training_steps=3")
    assert sorted(resumed.metrics()) == [3]  # resumed at step 3, not from scratch
    restored = [line for line in resumed.lines if "[verl_ext] restored entropy history" in line]
    assert restored, resumed.tail()
    assert json.loads(restored[0].split(": ", 1)[1]) == saved  # the thresholds before the stop, exactly
    after = json.loads((tmp_path / "ckpt" / "global_step_3" / STATE_FILE).read_text())["entropy_history"]
    logged = resumed.metrics()[3]
    for scope, state in saved["scopes"].items():  # then EMA updates on top of them, not a re-seed
        assert after["scopes"][scope]["num_updates"] == logged[f"gepo/{scope}/history_updates"]
        assert state["num_updates"] <= after["scopes"][scope]["num_updates"] <= state["num_updates"] + 1
    total = {name: sum(s["num_updates"] for s in h["scopes"].values()) for name, h in (("saved", saved), ("after", after))}
    assert total["after"] > total["saved"], total  # step 3 updated at least one scope

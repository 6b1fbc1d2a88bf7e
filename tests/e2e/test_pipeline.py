"""End to end on CPU: the real verl trainers (Ray, FSDP2 on gloo, the agent loop, the `hf` rollout) through
``python -m verl_ext.main``, 2 steps each on the embedded toy task (GEC on, as in the default). The edge_grpo runs
also run ``algorithm.edge_grpo.entropy_grad=true`` (the official EDGE-GRPO gradient through 1/H_i(θ)): legacy on 2
data-parallel ranks with several micro-batches per rank, v1 with 2 mini-batches per step.

The legacy run is run twice, seeded, with two batching windows of the ``hf`` servers: a seeded run does not depend on
how a server happens to batch its requests (which requests share a batch depends on their arrival times, i.e. on
machine load). One closes a batch as soon as the queue stops growing (``batch_window_ms=0``), the other waits 200 ms
for more; both must log the same outcome metrics at every step, validation's included, bit for bit. That includes the
rollout-vs-actor float diagnostics (``rollout_corr/*``, ``training/rollout_*``): they carry the rollout's log-probs, so
a batch-dependent rollout shows there from the first step, before any sampled token flips; and the validation before
training generates 100 held-out prompts on the two ranks' servers. That the runs are not identical by accident (a
rollout that ignores its seed) is a unit test's: rollout.seed from the config changes what a request samples
(tests/unit/test_hf_rollout.py::test_server_seeds_requests_by_identity_not_arrival). (The two runs were a separate
20-step pair of the one-rank default before; the claim shows at the first step, so the pair now carries this test's
claims too: CI time.)"""

from __future__ import annotations

import json
import math

import pytest

from tests.e2e.conftest import assert_rollout_diagnostics_see_sampled_tokens, launch_main

pytestmark = pytest.mark.e2e

V1 = "trainer.use_v1=true"
LEGACY = "trainer.use_v1=false"
ENTROPY_GRAD = "algorithm.edge_grpo.entropy_grad=true"


def entropy_grad_ran(run, steps: dict, one_mini_batch: bool) -> None:
    assert "[verl_ext] edge_grpo.entropy_grad=true" in run.output  # the loss was installed on the actor
    for values in steps.values():
        assert math.isfinite(values["actor/grad_norm"]) and math.isfinite(values["actor/pg_loss"])
        assert values["edge_grpo/entropy_grad_fallback_frac"] == 0.0
        assert not any("entropy_grad_raw" in key for key in values)  # only the summaries reach the logger
        if one_mini_batch:
            # the update's H_i(θ) is the old-log-prob pass's H_i(old), recomputed with gradients on the other side
            # (masked mean, same temperature), so their ratio is 1 up to float noise
            assert values["edge_grpo/entropy_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        else:  # the second mini-batch sees updated weights
            assert 0.5 < values["edge_grpo/entropy_ratio_mean"] < 1.5


def validation_untouched_by_gec(steps: dict) -> None:
    """The validation before training (step 0): GEC stays off for validation rollouts. The toy's hard split
    (toy_chain5) is five-digit chains its model does not solve (0.04 sampled at step 0); GEC's answer and solution
    branches (half of the edits) would make about half of them right."""
    values = steps.pop(0)
    for key in ("val-core/toy_chain5/acc/mean@1", "val-core/toy_chain5@greedy/acc/mean@1"):  # sampled and greedy rows
        if key in values:  # a random subset of the held-out rows (data.val_max_samples)
            assert values[key] < 0.25, values
    assert "val-core/toy_chain5/acc/mean@1" in values, values


def gec_dump_rendered(tmp_path, steps: int = 2, prompts: int = 4) -> str:
    """verl's rollout dump (``trainer.rollout_data_dir=rollouts``) carries what GEC wrote on every line, and
    ``report --samples`` renders it; returns the page."""
    from verl_ext.report import main as report_main

    branches = set()
    for step in range(1, steps + 1):
        lines = [json.loads(x) for x in (tmp_path / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert len(lines) == 8 * prompts and all(line["step"] == step for line in lines)
        for line in lines:
            branch, first, segments = line["gec_branch"], line["gec_first_response"], line["gec_segments"]
            branches.add(branch)
            assert "".join(s["text"] for s in segments) == line["output"], line  # the pieces are the final text
            kinds = [s["kind"] for s in segments]
            if branch in ("none", "gated", "answer_no_room"):  # untouched
                assert kinds == ["policy"] and first == line["output"] and line["score"] == line["gec_score_before"]
            elif branch == "reflect":
                assert kinds[-2:] == ["cue", "continuation"] and line["output"].startswith(first), line
            elif branch == "solution":
                assert kinds == ["solution", "eos"] and first is not None, line
            else:  # the answer template after the policy's own response
                assert kinds[-2:] == ["answer", "eos"] and line["output"].startswith(first), line
            assert line["gec_correct_before"] == (line["gec_score_before"] >= 1.0) and line["data_source"]
        groups = {}
        for line in lines:
            groups.setdefault(line["gec_group"], []).append(line)
        assert sorted(len(g) for g in groups.values()) == [8] * prompts
    assert branches & {"reflect", "answer", "solution"}, branches
    assert report_main([str(tmp_path / "rollouts"), "--samples", "-o", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "samples.html").read_text()
    for branch in branches:
        assert f"branch: {branch}</h2>" in page
    assert page.count('<div class="card">') >= len(branches) and "group before [" in page
    return page


def trained(steps: dict, n_steps: int = 2) -> None:
    assert sorted(steps) == list(range(1, n_steps + 1)), steps.keys()
    assert all("actor/pg_loss" in values for values in steps.values())
    # a step whose groups all share one reward has zero advantages (no update): the toy model is sure of many
    # prompts, so one such step in a short run happens; the run must have updated the actor at least once
    assert max(values["actor/grad_norm"] for values in steps.values()) > 0, steps


# gepo on v1: test_gpu_settings.py, the v1 pair (the same claims, plus padding, packing and 2 ranks);
# verl's own grpo on v1 (GEC on, verl_ext's diagnostics, none of its estimators' metrics): the same v1 pipeline, its
# advantage routing run by verl's own PPOTrainer._compute_advantage in
# tests/unit/test_v1_advantage.py::test_credit_options_on_v1_act_on_the_edited_real_rows_and_reach_the_loss[grpo]
#
# The embedded default (the demo: v1 sync, edge_grpo + GEC, 16 prompts x 8, seeded, prompts and rows in the data's
# order) for 10 steps, twice; with validation once (a random 100 of the held-out rows, ~a third of them the hard
# split's), verl's rollout dump with GEC's columns, rendered by report --samples, and entropy_grad over 2 mini-batches
# (its per-response fields through TransferQueue)
V1_DEMO_STEPS = 10
V1_DEMO = [V1, "algorithm.adv_estimator=edge_grpo", "data.train_batch_size=16",
           "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
           # data.seed: verl draws the val_max_samples subset with numpy's default_rng(data.seed), unseeded when null
           # (the demo's training order is seeded either way: verl's sampler generator has a fixed default seed)
           f"trainer.total_training_steps={V1_DEMO_STEPS}", "trainer.val_before_train=true", "data.val_max_samples=100",
           "data.seed=42",
           "trainer.rollout_data_dir=rollouts", ENTROPY_GRAD]
# both tests read the module's one pair of runs: one pytest-xdist work unit
V1_PAIR = pytest.mark.xdist_group("e2e/test_pipeline/v1_demo")


@pytest.fixture(scope="module")
def v1_demo_runs(tmp_path_factory):
    """The seeded v1 demo run, twice: ``[(run, its folder), (run, its folder)]``."""
    runs = []
    for attempt in range(2):
        folder = tmp_path_factory.mktemp(f"v1_demo_{attempt}")
        runs.append((launch_main(folder, *V1_DEMO, timeout=900), folder))
    return runs


@V1_PAIR
def test_v1_trainer_edge_grpo(v1_demo_runs):
    run, folder = v1_demo_runs[0]
    assert "[verl_ext] trainer: verl's v1 trainer, sync mode" in run.output  # the embedded default's trainer
    steps = run.metrics()
    validation_untouched_by_gec(steps)
    gec_dump_rendered(folder, steps=V1_DEMO_STEPS, prompts=16)
    entropy_grad_ran(run, steps, one_mini_batch=False)
    trained(steps, V1_DEMO_STEPS)
    assert_rollout_diagnostics_see_sampled_tokens(steps, on_policy_steps=list(steps))  # sync: on-policy
    for values in steps.values():
        # GEC ran on the v1 path: responses corrected and re-scored
        # GEC edits only wrong responses, judged by one rule before and after: accuracy cannot fall
        assert values["gec/responses"] == 128 and values["gec/acc_after"] >= values["gec/acc_before"]
        assert {"verl_ext/collapsed_group_frac", "verl_ext/adv_var", "verl_ext/response_entropy_mean",
                "verl_ext/response_entropy_std"} <= set(values)
        assert values["verl_ext/response_entropy_mean"] > 0
        assert values["edge_grpo/factor_max"] > values["edge_grpo/factor_min"]
    # the method changed some advantages relative to plain GRPO
    assert max(v["verl_ext/frac_adv_modified"] for v in steps.values()) > 0


HF = "+actor_rollout_ref.rollout.engine_kwargs.hf"
# the paper preset's linear LR decay (verl_ext/lr_schedule.py) in verl's FSDP engine on both ranks, and entropy_grad
# with 8 micro-batches per rank in one mini-batch; seeded
LEGACY_TWO_RANKS = [LEGACY, "algorithm.adv_estimator=edge_grpo", "trainer.n_gpus_per_node=2",
                    "ray_kwargs.ray_init.num_gpus=2", "actor_rollout_ref.actor.optim.lr_scheduler_type=linear",
                    "actor_rollout_ref.actor.optim.lr=1e-3", ENTROPY_GRAD,
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "trainer.val_before_train=true",
                    "data.val_max_samples=100", "trainer.rollout_data_dir=rollouts", "data.seed=3",
                    "actor_rollout_ref.rollout.seed=3"]
# both tests read the module's one pair of runs: one pytest-xdist work unit
LEGACY_PAIR = pytest.mark.xdist_group("e2e/test_pipeline/legacy_two_ranks")


@pytest.fixture(scope="module")
def legacy_two_rank_runs(tmp_path_factory):
    """The seeded legacy two-rank run with the servers' batching window at 0 and at 200 ms: ``{window: (run, its
    folder)}``."""
    runs = {}
    for window, knobs in ((0, [f"{HF}.batch_window_ms=0"]),
                          (200, [f"{HF}.batch_window_ms=200", f"{HF}.max_batch_wait_ms=400"])):
        folder = tmp_path_factory.mktemp(f"legacy_two_ranks_window{window}")
        runs[window] = (launch_main(folder, *LEGACY_TWO_RANKS, *knobs, timeout=900), folder)
    return runs


@LEGACY_PAIR
def test_legacy_trainer_edge_grpo_on_two_ranks(legacy_two_rank_runs):
    run, folder = legacy_two_rank_runs[0]
    assert "[verl_ext] trainer: verl's legacy RayPPOTrainer" in run.output
    steps = run.metrics()
    validation_untouched_by_gec(steps)
    gec_dump_rendered(folder)
    trained(steps)
    entropy_grad_ran(run, steps, one_mini_batch=True)
    assert_rollout_diagnostics_see_sampled_tokens(steps, on_policy_steps=[1, 2])
    for values in steps.values():
        assert values["verl_ext/frac_adv_modified"] > 0 and "edge_grpo/factor_mean" in values
        assert values["gec/frac_edited"] > 0 and "gec/groups_rescued" in values
        # GEC's length budget: every edit fits, nothing cut
        assert values["gec/truncated"] == 0 and values["gec/count/answer_no_room"] == 0
    # verl logs the LR after the scheduler step: lr 1e-3 decays linearly to 0 over the 2 steps
    assert steps[1]["actor/lr"] == pytest.approx(0.5e-3) and steps[2]["actor/lr"] == pytest.approx(0.0)
    assert "hf_server_1_0" in run.output  # one rollout server per training rank: the sharded path ran


# wall-clock and memory measurements, never equal between two runs
TIMING_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "agent_loop/", "time/")


def _outcomes(steps: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    return {step: {k: v for k, v in values.items()
                   if not (k.startswith(TIMING_PREFIXES) or "/perf/" in k or "memory" in k)}
            for step, values in steps.items()}


@LEGACY_PAIR
def test_the_batching_window_changes_no_metric(legacy_two_rank_runs):
    eager = _outcomes(legacy_two_rank_runs[0][0].metrics())
    patient = _outcomes(legacy_two_rank_runs[200][0].metrics())
    assert sorted(eager) == [0, 1, 2]  # the validation before training, then 2 steps
    assert max(eager[step]["actor/grad_norm"] for step in (1, 2)) > 0  # the runs trained
    assert any(k.startswith("rollout_corr/") or k.startswith("training/rollout_") for k in eager[1])
    assert any(k.startswith("val-core/") for k in eager[0])
    for step, values in eager.items():
        assert len(values) > (20 if step == 0 else 50) and values.keys() == patient[step].keys()
        diff = {k: (v, patient[step][k]) for k, v in values.items() if v != patient[step][k]}
        assert not diff, f"step {step}: {sorted(diff.items())[:20]}"


@V1_PAIR
def test_two_seeded_v1_runs_log_the_same_metrics(v1_demo_runs):
    """verl's v1 sync trainer, seeded, GEC on: two runs give the same metrics file but for wall-clock and memory
    figures (verl_ext's data_order keeps v1's prompts and rows in the data's order; gec_agent names each request by
    its sample, so the hf backend's seeded sampling and GEC's branch draws follow the sample, not arrival order)."""
    first = _outcomes(v1_demo_runs[0][0].metrics())
    second = _outcomes(v1_demo_runs[1][0].metrics())
    assert sorted(first) == list(range(V1_DEMO_STEPS + 1))  # the validation before training, then the steps
    assert sum(first[step]["gec/frac_edited"] > 0 for step in first if step) > 0  # GEC edited
    for step, values in first.items():
        assert len(values) > (20 if step == 0 else 50) and values.keys() == second[step].keys()
        diff = {k: (v, second[step][k]) for k, v in values.items() if v != second[step][k]}
        assert not diff, f"step {step}: {sorted(diff.items())[:20]}"

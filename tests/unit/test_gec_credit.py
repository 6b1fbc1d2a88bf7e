"""GEC's credit options (docs/gec.md "Credit options") against a hand-computed reference: the per-token advantages
of a small edited batch, through the legacy trainer's advantage routing (verl's GRPO, edge_grpo, gepo) and v1's row
layout; the edit-scope barrier of the agent loop; the start-up refusals."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from verl_ext.algos.gec_credit import edit_masks, pre_correction_rewards, split_prefix_credit
from verl_ext.algos.history import GroupEntropyHistory
from verl_ext.config import ConfigError, GecConfig
from verl_ext.rollout import gec
from verl_ext.rollout.gec_agent_loop import GroupFirstAttempts
from verl_ext.trainer.gec_advantage import OFF_POLICY_MASK_KEY, advantages_with_credit, credit_edited_responses
from verl_ext.trainer.legacy import ExtRayPPOTrainer

EPS = 1e-6
WIDTH = 6
# two groups of four: branch, spans, reward before (r0) and after (r1) correction
ROWS = [
    ("reflect", [["policy", 0, 3], ["cue", 3, 4], ["continuation", 4, 6]], 0.0, 1.0),
    ("answer", [["policy", 0, 2], ["answer", 2, 4], ["eos", 4, 5]], 0.0, 1.0),
    ("solution", [["solution", 0, 4], ["eos", 4, 5]], 0.0, 1.0),
    ("reflect", [["policy", 0, 3], ["cue", 3, 4], ["continuation", 4, 6]], 0.0, 0.0),
    ("none", [["policy", 0, 4]], 1.0, 1.0),
    ("answer", [["policy", 0, 1], ["answer", 1, 3], ["eos", 3, 4]], 0.0, 1.0),
    ("gated", [["policy", 0, 5]], 0.0, 0.0),
    ("reflect", [["policy", 0, 2], ["cue", 2, 3], ["continuation", 3, 6]], 0.0, 0.0),
]
LENGTHS = [6, 5, 5, 6, 4, 4, 5, 6]
# GRPO by hand (unbiased std): group 1 r1 = [1,1,1,0] (mean 3/4, std 1/2), r0 = all 0 (advantage 0);
# group 2 r1 = [1,1,0,0] (mean 1/2, std sqrt(1/3)), r0 = [1,0,0,0] (mean 1/4, std 1/2)
A_POS, A_NEG = 0.25 / (0.5 + EPS), -0.75 / (0.5 + EPS)
B_POS, B_NEG = 0.5 / (3 ** -0.5 + EPS), -0.5 / (3 ** -0.5 + EPS)
B0_WRONG = -0.25 / (0.5 + EPS)
PAPER = [[A_POS] * 6, [A_POS] * 5, [A_POS] * 5, [A_NEG] * 6, [B_POS] * 4, [B_POS] * 4, [B_NEG] * 5, [B_NEG] * 6]
BEFORE = [[0, 0, 0, A_POS, A_POS, A_POS], [0, 0, A_POS, A_POS, A_POS], [A_POS] * 5, [0, 0, 0, A_NEG, A_NEG, A_NEG],
          [B_POS] * 4, [B0_WRONG, B_POS, B_POS, B_POS], [B_NEG] * 5, [B0_WRONG, B0_WRONG, B_NEG, B_NEG, B_NEG, B_NEG]]
ZERO = [[0, 0, 0, A_POS, A_POS, A_POS], [0, 0, A_POS, A_POS, A_POS], [A_POS] * 5, [0, 0, 0, A_NEG, A_NEG, A_NEG],
        [B_POS] * 4, [0, B_POS, B_POS, B_POS], [B_NEG] * 5, [0, 0, B_NEG, B_NEG, B_NEG, B_NEG]]
EXPECTED = {"after": PAPER, "before": BEFORE, "zero": ZERO}
OFF_POLICY = [[], [2, 3, 4], [0, 1, 2, 3, 4], [], [], [1, 2, 3], [], []]  # answer / solution / their EOS
# per-response entropy (constant over its tokens): EDA's H̄_g / H_i = [1.5, 0.75, 1.5, 0.75], [1.5, 1.5, 0.75, 0.75]
ENTROPY = [1.0, 2.0, 1.0, 2.0, 1.0, 1.0, 2.0, 2.0]
EDA_FACTOR = [1.5, 0.75, 1.5, 0.75, 1.5, 1.5, 0.75, 0.75]


def _tokens(rows) -> torch.Tensor:
    out = torch.zeros(len(rows), WIDTH)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def _gec_columns():
    return {gec.KEY_BRANCH: np.array([r[0] for r in ROWS], dtype=object),
            gec.KEY_SPANS: np.array([r[1] for r in ROWS] + [None], dtype=object)[:-1],
            gec.KEY_SCORE_BEFORE: np.array([r[2] for r in ROWS], dtype=object)}


def _batch() -> DataProto:
    lengths = torch.tensor(LENGTHS)
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).float()
    scores = torch.zeros(len(ROWS), WIDTH)
    scores[torch.arange(len(ROWS)), lengths - 1] = torch.tensor([r[3] for r in ROWS])
    old_log_probs = -torch.linspace(0.2, 1.6, len(ROWS) * WIDTH).reshape(len(ROWS), WIDTH) * mask
    entropy = torch.tensor(ENTROPY)[:, None] * mask
    non_tensor = {"uid": np.array(["a"] * 4 + ["b"] * 4, dtype=object), **_gec_columns()}
    return DataProto.from_dict(tensors={"token_level_scores": scores, "token_level_rewards": scores.clone(),
                                        "response_mask": mask, "old_log_probs": old_log_probs, "entropy": entropy},
                               non_tensors=non_tensor)


def _trainer(estimator: str, **gec_options) -> ExtRayPPOTrainer:
    """The legacy trainer's advantage routing on its own (no workers): verl's compute_advantage, verl_ext's glue."""
    trainer = ExtRayPPOTrainer.__new__(ExtRayPPOTrainer)
    trainer.config = OmegaConf.create({"algorithm": {"adv_estimator": estimator, "norm_adv_by_std_in_grpo": True,
                                                     "gec": {"enable": True, **gec_options}}})
    trainer._verl_compute_advantage = ray_trainer.compute_advantage
    return trainer


def _advantages(trainer, data):
    out = trainer._routed_compute_advantage(data, trainer.config.algorithm.adv_estimator, gamma=1.0, lam=1.0,
                                            num_repeat=1, norm_adv_by_std_in_grpo=True,
                                            config=trainer.config.algorithm)
    return out, trainer._ext_take_metrics()


@pytest.mark.parametrize("rule", ["after", "before", "zero"])
def test_grpo_per_token_advantages_equal_the_hand_computed_ones(rule):
    data, metrics = _advantages(_trainer("grpo", prefix_advantage=rule), _batch())
    assert torch.allclose(data.batch["advantages"], _tokens(EXPECTED[rule]), atol=1e-6)
    if rule == "after":
        assert not any(k.startswith("gec/credit/") for k in metrics)
        return
    # prefixes of the edited rows 0, 1, 3, 5, 7 (the solution row 2 has none): 3 + 2 + 3 + 1 + 2 tokens
    assert metrics["gec/credit/prefix_token_count"] == 11
    paper_mean = (3 * A_POS + 2 * A_POS + 3 * A_NEG + B_POS + 2 * B_NEG) / 11
    assert metrics["gec/credit/prefix_adv_paper_mean"] == pytest.approx(paper_mean, rel=1e-5)
    ours = (3 * B0_WRONG) / 11 if rule == "before" else 0.0
    assert metrics["gec/credit/prefix_adv_mean"] == pytest.approx(ours, abs=1e-6)


def test_edge_grpo_scales_both_spans_by_the_responses_own_factor():
    """EDA's H̄_g/H_i is per response: the r0 advantage of the prefix and the r1 advantage of the edit both carry it."""
    data, _ = _advantages(_trainer("edge_grpo", prefix_advantage="before"), _batch())
    expected = _tokens(BEFORE) * torch.tensor(EDA_FACTOR)[:, None]
    assert torch.allclose(data.batch["advantages"], expected, atol=1e-5)


def test_gepo_shapes_both_passes_with_the_steps_thresholds_and_updates_its_history_once():
    trainer = _trainer("gepo", prefix_advantage="before")
    trainer.config.algorithm.gepo = {"alpha_low": 0.5, "alpha_high": 0.2}
    data = _batch()
    reference = {}
    for name, rewards in (("after", data.batch["token_level_rewards"]),
                          ("before", pre_correction_rewards(data.batch["token_level_rewards"],
                                                            data.batch["response_mask"],
                                                            data.batch["token_level_scores"].sum(-1),
                                                            torch.tensor([r[2] for r in ROWS])))):
        reference[name], _ = get_adv_estimator_fn("gepo")(
            token_level_rewards=rewards, response_mask=data.batch["response_mask"], index=data.non_tensor_batch["uid"],
            config=trainer.config.algorithm, entropy_history=GroupEntropyHistory(),
            old_log_probs=data.batch["old_log_probs"], metrics={}, loss_inputs={})
    out, metrics = _advantages(trainer, data)
    prefix, _ = edit_masks([r[1] for r in ROWS], [r[0] in gec.EDIT_BRANCHES for r in ROWS], WIDTH)
    expected = split_prefix_credit(reference["after"], prefix & out.batch["response_mask"].bool(), "before",
                                   reference["before"])
    assert torch.allclose(out.batch["advantages"], expected, atol=1e-6)
    assert not torch.allclose(reference["after"], reference["before"])
    assert trainer.entropy_history.num_updates("global") == 1 and metrics["gepo/history_updates"] == 1


@pytest.mark.parametrize("update_before_shaping", [True, False])
def test_gepos_r0_pass_shapes_with_the_thresholds_of_the_steps_pass(update_before_shaping):
    """With a history from an earlier step that shapes nothing (thresholds 0 and 10) and ema_gamma=1 (the step's
    update makes group a low-entropy and b high): the r0 pass shapes as the step's pass does, before the step's
    update (``update_before_shaping=false``: a copy from before the step) or after it (true: the step's history)."""
    trainer = _trainer("gepo", prefix_advantage="before")
    trainer.config.algorithm.gepo = {"alpha_low": 0.5, "alpha_high": 0.2, "ema_gamma": 1.0,
                                     "update_before_shaping": update_before_shaping}
    earlier = {"version": 1, "scopes": {"global": {"h_low": 0.0, "h_high": 10.0, "num_updates": 1}}}
    trainer.entropy_history.load_state_dict(earlier)
    data = _batch()
    r0 = pre_correction_rewards(data.batch["token_level_rewards"], data.batch["response_mask"],
                                data.batch["token_level_scores"].sum(-1), torch.tensor([r[2] for r in ROWS]))

    def reference(rewards, state, shape_first=False):  # shape_first: with the state's thresholds, then update
        history, config = GroupEntropyHistory(), OmegaConf.create(OmegaConf.to_container(trainer.config.algorithm))
        history.load_state_dict(state)
        if shape_first:
            config.gepo.update_before_shaping = False
        return get_adv_estimator_fn("gepo")(
            token_level_rewards=rewards, response_mask=data.batch["response_mask"], index=data.non_tensor_batch["uid"],
            config=config, entropy_history=history, old_log_probs=data.batch["old_log_probs"],
            metrics={}, loss_inputs={})[0]

    adv_after, adv_before = reference(data.batch["token_level_rewards"], earlier), reference(r0, earlier)
    out, _ = _advantages(trainer, data)
    prefix, _ = edit_masks([r[1] for r in ROWS], [r[0] in gec.EDIT_BRANCHES for r in ROWS], WIDTH)
    expected = split_prefix_credit(adv_after, prefix & out.batch["response_mask"].bool(), "before", adv_before)
    assert torch.allclose(out.batch["advantages"], expected, atol=1e-6)
    assert trainer.entropy_history.num_updates("global") == 2
    # an r0 pass shaped with the other thresholds (before the step's update / after it) fails the check above
    other = earlier if update_before_shaping else trainer.entropy_history.state_dict()
    wrong = split_prefix_credit(adv_after, prefix & out.batch["response_mask"].bool(), "before",
                                reference(r0, other, shape_first=True))
    assert not torch.allclose(wrong, expected, atol=1e-6)


@pytest.mark.parametrize("rule", ["after", "before", "zero"])
def test_the_r0_pass_is_prepared_before_the_steps_pass_and_runs_only_for_before(rule):
    """The one sequence both trainers call: the r0 pass is prepared before the step's pass (which may change the
    state it reads), runs after it on the batch with r0, and neither happens unless ``prefix_advantage=before``."""
    calls = []

    def estimator(name):
        def run(batch):
            calls.append((name, batch.batch["token_level_rewards"].sum().item()))
            batch.batch["advantages"] = torch.zeros_like(batch.batch["response_mask"])
            return batch
        return run

    def prepare_r0_pass():
        calls.append(("prepare", None))
        return estimator("r0")

    data = _batch()
    r1_sum, r0_sum = data.batch["token_level_rewards"].sum().item(), sum(r[2] for r in ROWS)
    cfg = GecConfig(enable=True, prefix_advantage=rule).validate()
    advantages_with_credit(data, data.non_tensor_batch, cfg, estimator("step"), prepare_r0_pass)
    expected = [("prepare", None), ("step", r1_sum), ("r0", r0_sum)] if rule == "before" else [("step", r1_sum)]
    assert calls == expected


def test_shaped_marks_the_injected_answer_and_solution_tokens_for_the_loss():
    data, metrics = _advantages(_trainer("grpo", injected_loss="shaped"), _batch())
    assert torch.equal(data.batch["advantages"], _tokens(PAPER))  # the advantages stay the paper's
    expected = torch.zeros(len(ROWS), WIDTH)
    for i, positions in enumerate(OFF_POLICY):
        expected[i, positions] = 1.0
    assert torch.equal(data.batch[OFF_POLICY_MASK_KEY], expected)
    assert metrics["gec/credit/off_policy_token_count"] == 11


def test_v1_rows_give_the_same_credit_and_leave_padding_rows_alone():
    """v1 hands GEC's fields as one ``extra_fields`` dict per row; verl's padding rows copy row 0's fields."""
    cfg = GecConfig(enable=True, prefix_advantage="zero", injected_loss="shaped").validate()
    columns = _gec_columns()
    extra = np.empty(len(ROWS) + 1, dtype=object)
    for i in range(len(ROWS)):
        extra[i] = {k: v[i] for k, v in columns.items()}
    extra[-1] = dict(extra[0])  # a padding row
    paper = torch.cat([_tokens(PAPER), _tokens([PAPER[0]])])
    mask = torch.cat([_batch().batch["response_mask"], _batch().batch["response_mask"][:1]])
    data = DataProto.from_dict(tensors={"advantages": paper.clone(), "response_mask": mask})
    real = np.array([True] * len(ROWS) + [False])
    credit_edited_responses(data, {"extra_fields": extra}, cfg, rows=real)
    assert torch.allclose(data.batch["advantages"][:-1], _tokens(ZERO), atol=1e-6)
    assert torch.equal(data.batch["advantages"][-1], paper[-1])
    assert data.batch[OFF_POLICY_MASK_KEY][-1].sum() == 0


def test_pre_correction_rewards_swap_only_the_outcome():
    rewards = torch.tensor([[0.1, -0.2, 1.3, 0.0], [0.0, 0.5, 0.0, 0.0]])  # a per-token term + the outcome at the end
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    out = pre_correction_rewards(rewards, mask, score_after=torch.tensor([1.2, 0.5]),
                                 score_before=torch.tensor([0.2, 0.5]))
    assert torch.allclose(out, torch.tensor([[0.1, -0.2, 0.3, 0.0], [0.0, 0.5, 0.0, 0.0]]))


# ---- edit_scope=all_wrong_groups: the agent loop's group barrier ------------------------------------------------


def test_a_group_is_all_wrong_only_when_every_first_attempt_is_wrong():
    async def group(correct: list[bool], delays: list[float]):
        board = GroupFirstAttempts()

        async def member(c, d):
            await asyncio.sleep(d)
            return await board.all_wrong("uid-1", len(correct), c)
        return await asyncio.gather(*(member(c, d) for c, d in zip(correct, delays)))

    assert asyncio.run(group([False] * 4, [0.0, 0.01, 0.02, 0.03])) == [True] * 4
    # a right attempt anywhere (here the last to arrive) makes the group not all wrong for every member
    assert asyncio.run(group([False, False, False, True], [0.0, 0.01, 0.02, 0.03])) == [False] * 4
    assert asyncio.run(group([True, False], [0.0, 0.01])) == [False, False]


def test_a_group_wait_past_its_limit_stops_with_the_setting_named():
    """A wrong first attempt waits at most ``wait_s`` for a sibling that is still running, then raises naming
    ``algorithm.gec.group_wait_s``; the sibling, arriving later, goes on with the group's verdict."""
    board = GroupFirstAttempts()

    async def group():
        board.join("uid-2", 2)
        board.join("uid-2", 2)  # the sibling started and is still generating
        with pytest.raises(RuntimeError, match=r"waited algorithm\.gec\.group_wait_s=0\.05 s .*1 of 2 reported"):
            await board.all_wrong("uid-2", 2, False, wait_s=0.05)
        return await board.all_wrong("uid-2", 2, False, wait_s=0.05)

    assert asyncio.run(group()) is True  # both first attempts were wrong
    assert not board._open


def test_a_member_failing_after_a_right_one_leaves_the_groups_decision():
    """A failure resolves a group only while it is undecided: once a right first attempt decided it, the wrong
    members still to report get that answer (the failed sample raises on its own)."""
    board = GroupFirstAttempts()

    async def group():
        right = await board.all_wrong("uid-3", 3, True)
        board.failed("uid-3", 3, RuntimeError("the engine died"))
        return right, await board.all_wrong("uid-3", 3, False)

    assert asyncio.run(group()) == (False, False)
    assert not board._open


@pytest.mark.parametrize("third_right", [True, False])
def test_a_failure_leaves_a_group_undecided_until_every_member_is_in(third_right):
    """Three members joined; one waits wrong, one fails, then the third reports. The failure alone decides nothing:
    the waiting one still waits; a right third makes the group not all wrong for both; a wrong third leaves it
    undecidable (the failed one's first attempt is unknown), and both wrong ones raise, naming the failure."""
    board = GroupFirstAttempts()

    async def group():
        for _ in range(3):
            board.join("uid-4", 3)
        waiting = asyncio.create_task(board.all_wrong("uid-4", 3, False))
        await asyncio.sleep(0.01)
        board.failed("uid-4", 3, RuntimeError("the engine died"))
        await asyncio.sleep(0.01)
        still_waiting = not waiting.done()
        third = asyncio.create_task(board.all_wrong("uid-4", 3, third_right))
        return still_waiting, await asyncio.gather(waiting, third, return_exceptions=True)

    still_waiting, results = asyncio.run(group())
    assert still_waiting
    if third_right:
        assert results == [False, False]
    else:
        for result in results:
            assert isinstance(result, RuntimeError), result
            assert "uid-4" in str(result) and "RuntimeError: the engine died" in str(result)
    assert not board._open


def test_out_of_scope_wrong_responses_stay_unedited_without_a_draw():
    cfg = GecConfig(enable=True, edit_scope="all_wrong_groups").validate()

    class NoDraw:
        def random(self):
            raise AssertionError("drew a branch")

    branch = gec.choose_branch(cfg, correct=False, prompt_len=3, has_solution=True, rng=NoDraw(),
                               group_all_wrong=False)
    assert branch == gec.BRANCH_GROUP_NOT_ALL_WRONG and branch not in gec.EDIT_BRANCHES
    assert gec.choose_branch(GecConfig(enable=True).validate(), correct=False, prompt_len=3, has_solution=True,
                             rng=gec.sample_rng(0, 1), group_all_wrong=False) in gec.EDIT_BRANCHES  # scope all


# ---- start-up refusals --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"injected_loss": "shaped", "mask_injected": True}, "mask_injected"),
    ({"injected_loss": "shaped", "mode": "force_reflect"}, "never draws"),
    ({"injected_loss": "shaped", "shaping_gamma": 0.0}, "shaping_gamma"),
    ({"shaping_gamma": 0.2}, r"algorithm\.gec\.shaping_gamma=0\.2 is invalid: .*injected_loss=policy"),  # would be ignored
    ({"prefix_advantage": "early"}, "prefix_advantage"),
    ({"edit_scope": "some"}, "edit_scope"),
    ({"edit_scope": "all_wrong_groups", "group_wait_s": 0}, r"group_wait_s=0 is invalid: must be null or a number"),
    ({"edit_scope": "all_wrong_groups", "group_wait_s": -5.0}, "group_wait_s"),
    ({"edit_scope": "all_wrong_groups", "group_wait_s": float("inf")}, "group_wait_s"),
    ({"edit_scope": "all_wrong_groups", "group_wait_s": True}, "group_wait_s"),
    ({"edit_scope": "all_wrong_groups", "group_wait_s": "1h"}, "group_wait_s"),
    ({"group_wait_s": 600.0}, r"group_wait_s=600\.0 is invalid: .*edit_scope=all_wrong_groups"),  # would be ignored
])
def test_nonsensical_gec_settings_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        GecConfig(enable=True, **options).validate()


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.gec.enable=false", "algorithm.gec.prefix_advantage=zero"], "algorithm.gec.enable=false"),
    (["algorithm.adv_estimator=gae", "algorithm.gec.prefix_advantage=before"], "adv_estimator=gae"),
    (["algorithm.gec.injected_loss=shaped", "algorithm.edge_grpo.entropy_grad=true"], "entropy_grad=true"),
    # the legacy trainer's rule (a group must sit in one agent-loop worker); the toy's default trainer is v1
    (["trainer.use_v1=false", "algorithm.gec.edit_scope=all_wrong_groups", "data.train_batch_size=16",
      "actor_rollout_ref.rollout.agent.num_workers=3"], "num_workers=3"),
    # the legacy trainer appends remax's greedy baseline rows (the group's uid, tagged as training rollouts) to the
    # generation batch: GEC would edit the baseline, and under all_wrong_groups count it as an (n+1)-th member
    (["trainer.use_v1=false", "algorithm.adv_estimator=remax", "algorithm.gec.edit_scope=all_wrong_groups",
      "data.train_batch_size=16", "actor_rollout_ref.rollout.agent.num_workers=1"], "adv_estimator=remax"),
    (["trainer.use_v1=false", "algorithm.adv_estimator=remax"], "adv_estimator=remax"),
    # geo_mean averages a response's advantages into one: a per-token prefix credit would be averaged away
    (["actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean", "algorithm.gec.prefix_advantage=zero"], "geo_mean"),
])
def test_credit_options_that_cannot_work_with_the_run_are_refused_at_start_up(overrides, message):
    from verl_ext.dry_run import compose_run_config
    from verl_ext.run_checks import validate_feature_combinations

    config = compose_run_config("toy_cpu", overrides)
    with pytest.raises(ConfigError, match=message):
        validate_feature_combinations(config)


SCOPE = ["algorithm.gec.enable=true", "algorithm.gec.edit_scope=all_wrong_groups"]


@pytest.mark.parametrize("overrides, refused", [
    # verl's rate_limited reward manager may take reward.timeout (300 s unless set) to score one first attempt
    (["algorithm.gec.group_wait_s=120", "reward.reward_manager.name=rate_limited"], True),
    (["algorithm.gec.group_wait_s=120", "reward.reward_manager.name=rate_limited", "+reward.timeout=60"], False),
    (["algorithm.gec.group_wait_s=60", "reward.reward_manager.name=rate_limited", "+reward.timeout=60"], True),
    (["algorithm.gec.group_wait_s=120"], False),  # verl's naive manager: no time limit on a score
    (["reward.reward_manager.name=rate_limited"], False),  # null: no limit of its own
])
def test_a_group_wait_within_verls_time_limit_on_one_score_is_refused(overrides, refused):
    from verl_ext.dry_run import compose_run_config
    from verl_ext.run_checks import validate_run_config

    config = compose_run_config("toy_cpu", SCOPE + overrides)
    if refused:
        with pytest.raises(ConfigError, match=r"group_wait_s=\d+ with reward\.reward_manager\.name=rate_limited"):
            validate_run_config(config)
    else:
        validate_run_config(config)


def test_shaping_gamma_is_luffys_unless_set_and_refused_where_nothing_reads_it():
    from verl_ext.dry_run import compose_run_config
    from verl_ext.run_checks import validate_run_config

    assert GecConfig(enable=True, injected_loss="shaped").validate().shaping_gamma == 0.1  # LUFFY's value
    assert GecConfig(enable=True, injected_loss="shaped", shaping_gamma=0.3).validate().shaping_gamma == 0.3
    base = ["algorithm.gec.enable=true", "actor_rollout_ref.rollout.n=2",  # 32 responses a step: micro-batches of 32
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32"]
    validate_run_config(compose_run_config("toy_cpu", base))  # the composed default is not "set"
    with pytest.raises(ConfigError, match=r"algorithm\.gec\.shaping_gamma=0\.1 is invalid: .*injected_loss=policy"):
        validate_run_config(compose_run_config("toy_cpu", [*base, "algorithm.gec.shaping_gamma=0.1"]))


SHAPED = "algorithm.gec.injected_loss=shaped"


def _shaped_with(*overrides):
    from verl_ext.dry_run import compose_run_config
    from verl_ext.run_checks import validate_feature_combinations

    validate_feature_combinations(compose_run_config("toy_cpu", ["algorithm.gec.enable=true", SHAPED, *overrides]))


# verl 0.9.1's policy losses in which a token of advantage 0 neither adds to the loss nor changes any other token's
# term (the reading of each: run_checks.SHAPED_POLICY_LOSSES); with loss_agg_mode set where the loss has its own
@pytest.mark.parametrize("overrides", [
    ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"],
    ["actor_rollout_ref.actor.policy_loss.loss_mode=dppo_tv"],
    ["actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl"],
    ["actor_rollout_ref.actor.policy_loss.loss_mode=gpg"],
    ["actor_rollout_ref.actor.policy_loss.loss_mode=cispo"],
    ["actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"],
])
def test_shaped_with_a_per_token_policy_loss_passes(overrides):
    _shaped_with(*overrides)


@pytest.mark.parametrize("loss_mode", ["gspo", "geo_mean", "dro", "clip_cov", "kl_cov", "bypass_mode",
                                       "a_loss_verl_adds_later"])
def test_shaped_with_a_policy_loss_that_keeps_zero_advantage_tokens_is_refused(loss_mode):
    with pytest.raises(ConfigError, match=rf"actor_rollout_ref\.actor\.policy_loss\.loss_mode={loss_mode} with "
                                          r"algorithm\.gec\.injected_loss=shaped: .*or injected_loss=policy"):
        _shaped_with(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}")


def test_shaped_with_sapo_needs_the_aggregation_sapo_uses():
    """SAPO aggregates its term by seq-mean-token-mean whatever loss_agg_mode says; the shaped term follows
    loss_agg_mode, so the two would be one loss only when they agree."""
    with pytest.raises(ConfigError, match=r"loss_mode=sapo with algorithm\.gec\.injected_loss=shaped and "
                                          r"actor_rollout_ref\.actor\.loss_agg_mode=token-mean"):
        _shaped_with("actor_rollout_ref.actor.policy_loss.loss_mode=sapo")


def test_the_policy_losses_allowed_with_shaped_are_verls():
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    from verl_ext.run_checks import SHAPED_POLICY_LOSSES

    assert set(SHAPED_POLICY_LOSSES) <= set(POLICY_LOSS_REGISTRY)


@pytest.mark.parametrize("overrides, refused", [
    (["trainer.use_v1=true"], True),  # v1: each micro-batch divided by its own longest response
    (["trainer.use_v1=true", "actor_rollout_ref.actor.loss_scale_factor=64"], False),
    (["trainer.use_v1=false"], False),  # legacy: the dense response width, a constant
])
def test_dr_grpos_horizon_must_be_a_constant_on_v1(overrides, refused):
    from verl_ext.dry_run import compose_run_config
    from verl_ext.run_checks import validate_feature_combinations

    config = compose_run_config("toy_cpu", ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                                            "algorithm.norm_adv_by_std_in_grpo=false", *overrides])
    if refused:
        with pytest.raises(ConfigError, match=r"loss_scale_factor=64 \(the legacy trainer's horizon\)"):
            validate_feature_combinations(config)
    else:
        validate_feature_combinations(config)

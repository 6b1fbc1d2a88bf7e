"""GroupEntropyHistory as a bounded running window per scope: warm-up pool, window thresholds, old states."""

import json
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from tests.unit.helpers import outcome_batch, uids
from verl_ext import GroupEntropyHistory
from verl_ext.algos.history import EntropyMoments, ThresholdRule
from verl_ext.config import ConfigError, load_algorithm_config
from verl_ext.trainer.mixin import ExtTrainerMixin

gepo = get_adv_estimator_fn("gepo")
grpo = get_adv_estimator_fn("grpo")
BATCHES = [(0.1, 0.5, 0.9), (0.3, 0.4, 1.4), (1.0, 1.2, 2.0), (0.2, 0.8, 1.1), (0.6, 0.7, 0.65)]


def groups_with_entropies(entropies):
    """[1, 0] groups (one token each) whose sampled-token NLL, hence H_g, is exactly the given value."""
    R, M = outcome_batch([1.0, 0.0] * len(entropies), [1] * 2 * len(entropies))
    L = -torch.tensor([[h] for h in entropies for _ in range(2)], dtype=torch.float32)
    return dict(token_level_rewards=R, response_mask=M, old_log_probs=L, index=uids(*[2] * len(entropies)))


def step(history, entropies, **gepo_cfg):
    metrics = {}
    adv, _ = gepo(**groups_with_entropies(entropies), config={"gepo": gepo_cfg}, entropy_history=history,
                  metrics=metrics)
    return adv, metrics


def expected(values, beta_low=0.2, beta_high=0.3):
    h = torch.tensor(values, dtype=torch.float32).double()  # H_g as the estimator computes it (float32)
    mu, sigma = h.mean().item(), h.std(unbiased=False).item()
    return mu - beta_low * sigma, mu + beta_high * sigma


def test_pooled_moments_equal_the_moments_of_the_union():
    gen = torch.Generator().manual_seed(0)
    parts = [torch.rand(n, generator=gen, dtype=torch.float64) * 3 for n in (5, 1, 9, 3)]
    pooled = EntropyMoments.pooled([EntropyMoments.of(p) for p in parts])
    union = torch.cat(parts)
    assert pooled.count == 18 and pooled.mean == pytest.approx(union.mean().item(), rel=1e-12)
    assert pooled.std() == pytest.approx(union.std(unbiased=False).item(), rel=1e-12)
    assert pooled.std(unbiased=True) == pytest.approx(union.std(unbiased=True).item(), rel=1e-12)


def test_warmup_pool_shapes_nothing_then_seeds_from_the_pooled_batches():
    history = GroupEntropyHistory()
    cfg = {"ema_init": "warmup_pool", "warmup_steps": 3}
    for k in range(2):  # warming up: plain GRPO, no thresholds
        adv, metrics = step(history, BATCHES[k], **cfg)
        ref, _ = grpo(**{key: v for key, v in groups_with_entropies(BATCHES[k]).items() if key != "old_log_probs"})
        torch.testing.assert_close(adv, ref)
        assert history.thresholds() is None and metrics["gepo/warmup_batches"] == k + 1
        assert "gepo/H_low" not in metrics and metrics["verl_ext/frac_adv_modified"] == 0
    adv, metrics = step(history, BATCHES[2], **cfg)  # batch 3 seeds from the 9 pooled groups, and is shaped
    seed = expected([h for b in BATCHES[:3] for h in b])
    assert history.thresholds() == pytest.approx(seed, rel=1e-6)
    assert metrics["gepo/H_low"] == pytest.approx(seed[0], rel=1e-6) and metrics["verl_ext/frac_adv_modified"] > 0
    step(history, BATCHES[3], **cfg)  # then the EMA takes over from the seed
    est = expected(BATCHES[3])
    assert history.thresholds() == pytest.approx(
        (0.99 * seed[0] + 0.01 * est[0], 0.99 * seed[1] + 0.01 * est[1]), rel=1e-6)
    assert history.num_updates() == 4 and len(history.window()) == 4  # the window is bounded by window_size


def test_window_thresholds_follow_the_last_window_size_batches():
    history = GroupEntropyHistory()
    cfg = {"threshold_source": "window", "window_size": 2}
    step(history, BATCHES[0], **cfg)
    assert history.thresholds() == pytest.approx(expected(BATCHES[0]), rel=1e-6)  # first batch: its own
    for k in range(1, 4):
        step(history, BATCHES[k], **cfg)
        assert history.thresholds() == pytest.approx(expected(BATCHES[k - 1] + BATCHES[k]), rel=1e-6)
        assert [m.count for m in history.window()] == [3, 3]  # bounded: the last two batches only
    state = history.state_dict()
    assert state["version"] == 2 and len(state["scopes"]["global"]["window"]) == 2


def test_window_source_with_warmup_longer_than_the_window_seeds_from_the_whole_pool():
    history = GroupEntropyHistory()
    cfg = {"threshold_source": "window", "window_size": 2, "ema_init": "warmup_pool", "warmup_steps": 3}
    for k in range(3):
        step(history, BATCHES[k], **cfg)
    assert history.thresholds() == pytest.approx(expected([h for b in BATCHES[:3] for h in b]), rel=1e-6)
    assert len(history.window()) == 2
    step(history, BATCHES[3], **cfg)
    assert history.thresholds() == pytest.approx(expected(BATCHES[2] + BATCHES[3]), rel=1e-6)


@pytest.mark.parametrize("cfg", [
    {},
    {"ema_init": "warmup_pool", "warmup_steps": 2},
    {"threshold_source": "window", "window_size": 3},
    {"threshold_source": "window", "window_size": 2, "update_before_shaping": False},
    {"stats_scope": "per_data_source", "ema_init": "warmup_pool", "warmup_steps": 4, "window_size": 2},
])
def test_resume_from_json_shapes_exactly_like_an_unbroken_run(cfg):
    ds = np.array(["a"] * 4 + ["b"] * 2, dtype=object)

    def run(history, batches):
        out = []
        for b in batches:
            metrics = {}
            adv, _ = gepo(**groups_with_entropies(b), config={"gepo": cfg}, entropy_history=history,
                          data_source=ds, metrics=metrics)
            out.append(adv)
        return out

    unbroken = GroupEntropyHistory()
    full = run(unbroken, BATCHES)
    first = GroupEntropyHistory()
    head = run(first, BATCHES[:3])
    resumed = GroupEntropyHistory()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # what the checkpoint carries
    tail = run(resumed, BATCHES[3:])
    for a, b in zip(full, head + tail):
        assert torch.equal(a, b)
    assert resumed.state_dict() == unbroken.state_dict()


def test_todays_version_1_state_still_loads_and_continues_the_ema():
    # verl_ext_state.json's "entropy_history" as written before the window existed (state version 1)
    old = json.loads('{"version": 1, "scopes": {"toy_add": {"h_low": 1.2148, "h_high": 1.6831, "num_updates": 2},'
                     ' "toy_add2": {"h_low": 1.9, "h_high": 2.35, "num_updates": 2}}}')
    history = GroupEntropyHistory()
    history.load_state_dict(old)
    assert history.scopes() == ["toy_add", "toy_add2"] and history.thresholds("toy_add") == (1.2148, 1.6831)
    assert history.window("toy_add") == [] and history.num_updates("toy_add2") == 2
    rule = ThresholdRule()
    moments = EntropyMoments.of([1.0, 1.5, 2.0])
    low_hat, high_hat = rule.estimate(moments)
    history.update("toy_add", moments, rule)  # an EMA step on top of the restored thresholds, not a re-seed
    assert history.thresholds("toy_add") == pytest.approx((0.99 * 1.2148 + 0.01 * low_hat,
                                                           0.99 * 1.6831 + 0.01 * high_hat))
    assert history.num_updates("toy_add") == 3 and history.state_dict()["version"] == 2
    for bad in ({"version": 3, "scopes": {}}, {"scopes": {}}, {"version": 1, "scopes": {
            "g": {"h_low": 1.0, "h_high": None, "num_updates": 1}}}):
        with pytest.raises(ValueError, match="GroupEntropyHistory state"):
            GroupEntropyHistory().load_state_dict(bad)


def test_a_warming_up_state_round_trips_with_null_thresholds():
    history = GroupEntropyHistory()
    step(history, BATCHES[0], ema_init="warmup_pool", warmup_steps=3)
    state = json.loads(json.dumps(history.state_dict()))
    assert state["scopes"]["global"]["h_low"] is None and len(state["scopes"]["global"]["window"]) == 1
    restored = GroupEntropyHistory()
    restored.load_state_dict(state)
    assert restored.thresholds() is None and restored.num_updates() == 1


@pytest.mark.parametrize("node, message", [
    ({"ema_init": "warmup_pool"}, r"algorithm\.gepo\.warmup_steps=0 is invalid: must be >= 1 with "
                                  r"algorithm\.gepo\.ema_init=warmup_pool"),
    ({"warmup_steps": 5}, r"algorithm\.gepo\.warmup_steps=5 is invalid: only applies to "
                          r"algorithm\.gepo\.ema_init=warmup_pool"),
    ({"ema_init": "zero"}, r"algorithm\.gepo\.ema_init='zero' is invalid: must be one of \['first_batch', "),
    ({"threshold_source": "median"}, r"algorithm\.gepo\.threshold_source='median'.*\['ema', 'window'\]"),
    ({"window_size": 0}, r"algorithm\.gepo\.window_size=0 is invalid: must be an integer >= 1"),
    ({"warmup_steps": 1.5, "ema_init": "warmup_pool"}, r"algorithm\.gepo\.warmup_steps=1\.5 is invalid"),
])
def test_history_options_are_validated(node, message):
    with pytest.raises(ConfigError, match=message):
        load_algorithm_config({"gepo": node})


def test_moments_reject_nonfinite_input():
    with pytest.raises(ValueError, match="empty or not finite"):
        GroupEntropyHistory().update("global", EntropyMoments(1, math.nan, 0.0), ThresholdRule())


class ResumingTrainer(ExtTrainerMixin):
    """The trainer glue of a run resumed at ``step`` (verl's checkpoint loading itself left out)."""

    def __init__(self, root, step, estimator="gepo", **gepo):
        self.config = OmegaConf.create({
            "algorithm": {"adv_estimator": estimator, "gepo": gepo},
            "trainer": {"default_local_dir": str(root), "resume_mode": "auto", "resume_from_path": None}})
        self.global_steps = step


def test_gepo_resumed_without_its_history_stops_unless_told_to_start_fresh(tmp_path, caplog):
    (tmp_path / "global_step_4").mkdir()  # verl's checkpoint without verl_ext_state.json
    with pytest.raises(RuntimeError, match=r"verl_ext_state\.json.*algorithm\.gepo\.allow_fresh_history=true"):
        ResumingTrainer(tmp_path, 4)._ext_load_state()
    fresh = ResumingTrainer(tmp_path, 4, allow_fresh_history=True)
    with caplog.at_level("WARNING", logger="verl_ext.trainer.history_checkpoint"):
        fresh._ext_load_state()
    assert len(fresh.entropy_history) == 0 and "allow_fresh_history" in caplog.text
    ResumingTrainer(tmp_path, 4, "grpo")._ext_load_state()  # no GEPO: no history to lose
    ResumingTrainer(tmp_path, 0)._ext_load_state()  # training from scratch


def test_restored_history_is_logged_not_printed(tmp_path, capsys, caplog):
    trainer = ResumingTrainer(tmp_path, 2)
    trainer.entropy_history.update("global", EntropyMoments.of([0.4, 0.9]), ThresholdRule())
    trainer._ext_save_state()
    resumed = ResumingTrainer(tmp_path, 2)
    with caplog.at_level("INFO", logger="verl_ext.trainer.history_checkpoint"):
        resumed._ext_load_state()
    assert resumed.entropy_history.state_dict() == trainer.entropy_history.state_dict()
    assert capsys.readouterr().out == ""
    (line,) = [r.getMessage() for r in caplog.records if "[verl_ext] restored entropy history" in r.getMessage()]
    assert json.loads(line.split(": ", 1)[1]) == trainer.entropy_history.state_dict()  # what the e2e tests read


def test_allow_fresh_history_is_validated():
    assert load_algorithm_config({"gepo": {"allow_fresh_history": True}}).gepo.allow_fresh_history is True
    with pytest.raises(ConfigError, match=r"algorithm\.gepo\.allow_fresh_history='yes' is invalid: must be true or"):
        load_algorithm_config({"gepo": {"allow_fresh_history": "yes"}})


def test_trainer_glue_logs_through_logging_not_print():
    import inspect

    from verl_ext.trainer import history_checkpoint, mixin

    for module in (mixin, history_checkpoint):
        assert "print(" not in inspect.getsource(module), module.__name__

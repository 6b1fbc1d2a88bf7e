"""The batch -> estimator routing on real verl DataProto objects, and the history in checkpoints."""

import json
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from tests.unit.helpers import outcome_batch, uids
from verl_ext import GroupEntropyHistory
from verl_ext.algos.history import EntropyMoments, ThresholdRule
from verl_ext.trainer.advantage import ENTROPY_KEY, batch_diagnostics, compute_extension_advantage, estimator_kwargs
from verl_ext.trainer.history_checkpoint import STATE_FILE
from verl_ext.trainer.legacy import ExtRayPPOTrainer
from verl_ext.trainer.mixin import ExtTrainerMixin


def make_batch(n_groups=3, size=4, width=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = n_groups * size
    R, M = outcome_batch(torch.randint(0, 2, (n,), generator=gen).float(),
                         torch.randint(1, width + 1, (n,), generator=gen), width=width)
    tensors = {"token_level_rewards": R, "response_mask": M, "old_log_probs": -torch.rand(n, width, generator=gen),
               ENTROPY_KEY: torch.rand(n, width, generator=gen) + 0.1}
    non_tensors = {"uid": uids(*[size] * n_groups),
                   "data_source": np.array(["a", "b", "a"][: n_groups] * size, dtype=object).reshape(size, -1).T
                   .reshape(-1)}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def algo(estimator, **nodes):
    return OmegaConf.create({"adv_estimator": estimator, "norm_adv_by_std_in_grpo": True, **nodes})


def test_estimator_kwargs_read_entropy_logprobs_and_data_source():
    data = make_batch()
    history = GroupEntropyHistory()
    kw = estimator_kwargs(data, algo("gepo"), history)
    assert kw["entropy"] is data.batch[ENTROPY_KEY] and kw["old_log_probs"] is data.batch["old_log_probs"]
    assert list(kw["data_source"]) == list(data.non_tensor_batch["data_source"])
    assert kw["entropy_history"] is history and "rollout_log_probs" not in kw


def expected_advantage(data: DataProto, estimator: str) -> torch.Tensor:
    """The papers' formulas by hand (numpy, float64), from the batch's raw fields: what the routing must produce.

    edge_grpo: Â_i = A_i · H̄_g / H_i with A_i verl's GRPO advantage, H_i the masked mean of the per-token entropy.
    gepo (global scope, first batch): H_g = −ΣΣ old_log_probs / ΣΣ tokens per group; thresholds μ − 0.2σ, μ + 0.3σ
    over the batch's groups (population σ); positives × 0.5 below H_low, negatives × 0.2 above H_high.
    """
    mask = data.batch["response_mask"].double().numpy()
    scores = data.batch["token_level_rewards"].double().numpy().sum(-1)
    _, gid = np.unique(data.non_tensor_batch["uid"], return_inverse=True)
    groups = range(gid.max() + 1)
    mean = np.array([scores[gid == g].mean() for g in groups])
    std = np.array([scores[gid == g].std(ddof=1) for g in groups])
    adv = (scores - mean[gid]) / (std[gid] + 1e-6)
    if estimator == "edge_grpo":
        h = (data.batch[ENTROPY_KEY].double().numpy() * mask).sum(-1) / mask.sum(-1)
        h_bar = np.array([h[gid == g].mean() for g in groups])
        adv = adv * h_bar[gid] / h
    else:
        nll = -(data.batch["old_log_probs"].double().numpy() * mask).sum(-1)
        h_g = np.array([nll[gid == g].sum() / mask.sum(-1)[gid == g].sum() for g in groups])
        low, high = h_g.mean() - 0.2 * h_g.std(), h_g.mean() + 0.3 * h_g.std()
        adv = np.where((adv > 0) & (h_g[gid] < low), 0.5 * adv,
                       np.where((adv < 0) & (h_g[gid] > high), 0.2 * adv, adv))
    return torch.from_numpy(adv[:, None] * mask)


@pytest.mark.parametrize("estimator", ["edge_grpo", "gepo"])
def test_compute_extension_advantage_equals_the_papers_formula_and_logs(estimator):
    data = make_batch()
    expected = expected_advantage(data, estimator)
    data, metrics = compute_extension_advantage(data, estimator, algo(estimator), GroupEntropyHistory())
    torch.testing.assert_close(data.batch["advantages"].double(), expected, rtol=1e-5, atol=1e-6)
    assert (data.batch["advantages"] != 0).any()  # a batch with signal: the comparison is not 0 == 0
    assert "verl_ext/collapsed_group_frac" in metrics and "verl_ext/response_entropy_mean" in metrics
    assert "verl_ext/adv_var" in metrics
    assert ("edge_grpo/factor_mean" if estimator == "edge_grpo" else "gepo/H_low") in metrics


def test_compute_extension_advantage_keeps_one_history_scope_per_data_source():
    history = GroupEntropyHistory()
    _, metrics = compute_extension_advantage(make_batch(), "gepo", algo("gepo", gepo={"stats_scope": "per_data_source"}),
                                             history)
    assert history.scopes() == ["a", "b"] and "gepo/a/H_low" in metrics and "gepo/b/H_low" in metrics


def bare_legacy_trainer(estimator, tmp_path=None, step=0):
    trainer = ExtRayPPOTrainer.__new__(ExtRayPPOTrainer)  # no workers: only the routing is exercised
    trainer.config = OmegaConf.create({
        "algorithm": algo(estimator),
        "trainer": {"default_local_dir": str(tmp_path or "."), "resume_mode": "auto", "resume_from_path": None},
    })
    trainer.global_steps = step
    return trainer


def test_legacy_fit_routes_verl_compute_advantage_and_restores_it(monkeypatch):
    seen = {}

    def fake_fit(self):  # what verl's RayPPOTrainer.fit() does: calls the module-level compute_advantage
        data = make_batch()
        seen["data"] = ray_trainer.compute_advantage(data, adv_estimator="gepo", gamma=1.0, lam=1.0, num_repeat=4,
                                                     norm_adv_by_std_in_grpo=True, config=self.config.algorithm)
        seen["gepo_metrics"] = self._ext_take_metrics()
        seen["grpo"] = ray_trainer.compute_advantage(make_batch(), adv_estimator="grpo", config=self.config.algorithm)
        seen["grpo_metrics"] = self._ext_take_metrics()

    verl_fn = ray_trainer.compute_advantage
    monkeypatch.setattr(RayPPOTrainer, "fit", fake_fit)
    trainer = bare_legacy_trainer("gepo")
    trainer.fit()
    assert ray_trainer.compute_advantage is verl_fn  # restored after fit
    assert ENTROPY_KEY not in seen["data"].batch.keys()  # not shipped to the actor update
    assert trainer.entropy_history.num_updates() == 1
    assert "gepo/frac_pos_attenuated" in seen["gepo_metrics"]
    plain = make_batch()
    plain.batch.pop(ENTROPY_KEY)
    expected = verl_fn(plain, adv_estimator="grpo", config=trainer.config.algorithm)
    torch.testing.assert_close(seen["grpo"].batch["advantages"], expected.batch["advantages"])  # verl's own path
    assert ENTROPY_KEY not in seen["grpo"].batch.keys()
    # and the step diagnostics of verl's output, the same as verl_ext's estimators log
    grpo_metrics = seen["grpo_metrics"]
    assert not any(k.startswith(("gepo/", "edge_grpo/")) or k == "verl_ext/frac_adv_modified" for k in grpo_metrics)
    batch = make_batch()
    assert grpo_metrics == batch_diagnostics(batch.batch["token_level_rewards"], batch.batch["response_mask"],
                                             batch.non_tensor_batch["uid"], expected.batch["advantages"],
                                             batch.batch[ENTROPY_KEY])
    assert {"verl_ext/collapsed_group_frac", "verl_ext/adv_var", "verl_ext/response_entropy_mean",
            "verl_ext/response_entropy_std"} <= set(grpo_metrics)


class CheckpointingTrainer(ExtTrainerMixin):
    def __init__(self, root, step, mode="auto", path=None):
        self.config = OmegaConf.create({"algorithm": algo("gepo"), "trainer": {
            "default_local_dir": str(root), "resume_mode": mode, "resume_from_path": path}})
        self.global_steps = step


def test_history_is_saved_in_the_step_folder_and_restored(tmp_path):
    trainer = CheckpointingTrainer(tmp_path, 3)
    rule = ThresholdRule()
    trainer.entropy_history.update("global", EntropyMoments.of([0.4, 0.9]), rule)
    trainer.entropy_history.update("global", EntropyMoments.of([0.5, 1.0, 1.2]), rule)
    trainer._ext_save_state()
    path = tmp_path / "global_step_3" / STATE_FILE
    assert json.loads(path.read_text())["entropy_history"] == trainer.entropy_history.state_dict()
    resumed = CheckpointingTrainer(tmp_path, 3)
    resumed._ext_load_state()
    assert resumed.entropy_history.state_dict() == trainer.entropy_history.state_dict()
    by_path = CheckpointingTrainer(tmp_path / "elsewhere", 3, "resume_path", str(tmp_path / "global_step_3"))
    by_path._ext_load_state()
    assert by_path.entropy_history.thresholds() == trainer.entropy_history.thresholds()
    fresh = CheckpointingTrainer(tmp_path, 0)
    fresh._ext_load_state()
    assert len(fresh.entropy_history) == 0


def test_legacy_checkpoint_writes_history_before_verl_marks_the_step(tmp_path, monkeypatch):
    order = []
    monkeypatch.setattr(RayPPOTrainer, "_save_checkpoint",
                        lambda self: order.append(os.path.exists(tmp_path / "global_step_2" / STATE_FILE)))
    trainer = bare_legacy_trainer("gepo", tmp_path, step=2)
    trainer._save_checkpoint()
    assert order == [True]


def test_v1_trainers_are_extended_per_mode_keeping_verl_mode_names():
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from verl_ext.trainer.advantage import fit_width
    from verl_ext.trainer.v1 import ExtV1TrainerMixin, install_extension_trainers

    before = dict(TRAINER_REGISTRY)
    try:
        install_extension_trainers()
        for mode, cls in TRAINER_REGISTRY.items():
            assert issubclass(cls, ExtV1TrainerMixin) and issubclass(cls, before[mode])
        install_extension_trainers()  # idempotent
        assert all(TRAINER_REGISTRY[m].__bases__ == (ExtV1TrainerMixin, before[m]) for m in before)
    finally:
        TRAINER_REGISTRY.clear()
        TRAINER_REGISTRY.update(before)
    like = torch.zeros(2, 4)
    assert fit_width(torch.ones(2, 3), like).tolist() == [[1, 1, 1, 0]] * 2
    assert fit_width(torch.ones(2, 6), like).shape == (2, 4)


def test_batch_diagnostics_values():
    R, M = outcome_batch(torch.tensor([1.0, 1.0, 0.0, 1.0, 5.0]), torch.tensor([2, 3, 1, 1, 2]), width=3)
    adv = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [-2.0, 0.0, 0.0], [2.0, 0.0, 0.0], [9.0, 9.0, 0.0]])
    entropy = torch.tensor([[1.0, 3.0, 9.0], [1.0, 1.0, 1.0], [4.0, 9.0, 9.0], [2.0, 9.0, 9.0], [1.0, 1.0, 9.0]])
    m = batch_diagnostics(R, M, uids(2, 2, 1), adv, entropy)  # groups: {1, 1} collapsed, {0, 1}, {5} singleton
    assert m["verl_ext/collapsed_group_frac"] == 0.5 and m["verl_ext/singleton_group_count"] == 1
    per_response_adv = torch.tensor([1.0, 0.0, -2.0, 2.0, 9.0])
    assert m["verl_ext/adv_var"] == pytest.approx(per_response_adv.var().item())
    h = torch.tensor([2.0, 1.0, 4.0, 2.0, 1.0])  # masked means
    assert m["verl_ext/response_entropy_mean"] == pytest.approx(h.mean().item())
    assert m["verl_ext/response_entropy_std"] == pytest.approx(h.std(unbiased=False).item())
    assert "verl_ext/response_entropy_mean" not in batch_diagnostics(R, M, uids(2, 2, 1), adv)  # bypass: no entropy


def test_file_logger_path_never_overwrites_a_run_s_metrics(tmp_path, monkeypatch):
    from verl_ext.trainer.runner import point_file_logger

    requested = tmp_path / "run" / "metrics.jsonl"
    config = OmegaConf.create({"trainer": {"file_logger_path": str(requested)}})
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    point_file_logger(config)
    assert os.environ["VERL_FILE_LOGGER_PATH"] == str(requested) and requested.parent.is_dir()
    requested.write_text('{"step": 1, "data": {}}\n')  # the run before a resume into the same folder
    point_file_logger(config)
    assert os.environ["VERL_FILE_LOGGER_PATH"] == str(tmp_path / "run" / "metrics.1.jsonl")
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH")
    point_file_logger(OmegaConf.create({"trainer": {"file_logger_path": None}}))  # verl's own default
    assert "VERL_FILE_LOGGER_PATH" not in os.environ


# ---- GEC: rows sent to rollout are tagged as training or validation (read by the gec_agent loop) -----------------


def _gec_config(trainer, enable: bool):
    trainer.config.algorithm.gec = {"enable": enable}
    trainer._ext_config = None


def test_legacy_rows_tagged_training_in_fit_and_validation_in_validate(monkeypatch):
    """verl's own _get_gen_batch builds the rollout batch; _validate (faked: verl's calls _get_gen_batch) marks
    its rows False, fit's rows are True; with GEC off the batch is verl's, untagged."""
    from verl_ext.names import TRAINING_ROLLOUT_KEY

    def rows():
        return DataProto.from_single_dict({"input_ids": torch.zeros(3, 2, dtype=torch.long),
                                           "raw_prompt": np.array(["a", "b", "c"], dtype=object),
                                           "uid": np.array(["u", "u", "v"], dtype=object)})

    monkeypatch.setattr(RayPPOTrainer, "_validate", lambda self, merged=False: self._get_gen_batch(rows()))
    trainer = bare_legacy_trainer("edge_grpo")
    _gec_config(trainer, enable=True)
    assert list(trainer._get_gen_batch(rows()).non_tensor_batch[TRAINING_ROLLOUT_KEY]) == [True] * 3
    assert list(trainer._validate().non_tensor_batch[TRAINING_ROLLOUT_KEY]) == [False] * 3
    assert list(trainer._get_gen_batch(rows()).non_tensor_batch[TRAINING_ROLLOUT_KEY]) == [True] * 3  # reset
    _gec_config(trainer, enable=False)
    assert TRAINING_ROLLOUT_KEY not in trainer._get_gen_batch(rows()).non_tensor_batch


def test_v1_rows_tagged_training_in_train_batches_and_validation_in_validate(monkeypatch):
    """v1: every row of a training batch carries True (per row, so async modes persist it); the batches verl's
    _validate reads from val_dataloader carry False; the dataloader is restored afterwards."""
    from tensordict import NonTensorStack
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils import tensordict_utils as tu

    from verl_ext.names import TRAINING_ROLLOUT_KEY
    from verl_ext.trainer.v1 import extended_trainer_cls

    def train_batch(self, num_prompts=None):
        return tu.get_tensordict({"input_ids": torch.zeros(2, 3), "uid": np.array(["a", "b"], dtype=object)})

    def validate(self):  # what verl's _validate does with its dataloader: a TensorDict per batch dict
        return [tu.get_tensordict(dict(batch_dict)) for batch_dict in self.val_dataloader]

    monkeypatch.setattr(PPOTrainer, "_next_train_batch", train_batch)
    monkeypatch.setattr(PPOTrainer, "_validate", validate)
    sync = get_trainer_cls("sync")
    assert "_next_train_batch" not in vars(sync) and "_validate" not in vars(sync)  # PPOTrainer's, faked above
    cls = extended_trainer_cls(sync)
    trainer = cls.__new__(cls)
    trainer.config = OmegaConf.create({"algorithm": algo("grpo")})
    loader = [{"raw_prompt": np.array(["p", "q", "r"], dtype=object), "input_ids": torch.zeros(3, 2)}]
    trainer.val_dataloader = loader
    _gec_config(trainer, enable=True)

    batch = trainer._next_train_batch()
    column = dict(batch.items())[TRAINING_ROLLOUT_KEY]
    assert isinstance(column, NonTensorStack) and [column[i].data for i in range(2)] == [True, True]
    (val,) = trainer._validate()
    column = dict(val.items())[TRAINING_ROLLOUT_KEY]
    assert [column[i].data for i in range(3)] == [False] * 3
    assert trainer.val_dataloader is loader
    _gec_config(trainer, enable=False)
    assert TRAINING_ROLLOUT_KEY not in trainer._next_train_batch()
    assert TRAINING_ROLLOUT_KEY not in trainer._validate()[0]

"""verl's rollout-vs-actor diagnostics with GEC on: over the tokens an engine sampled only, on both trainers.

The responses are built by GEC's own ``assemble_response`` (unedited, reflection, answer, reference solution); the
diagnostics are verl's own functions, called where verl's trainers call them: v1 through verl's
``PPOTrainer._compute_old_log_prob`` and ``_compute_advantage`` (TransferQueue an in-memory stand-in, the actor a stub
that writes its log-probs), legacy as ``RayPPOTrainer.fit`` imports and calls them, inside the context verl_ext's
``fit`` runs them in. The control is verl itself: the same step without verl_ext's hooks (verl's own methods), and
the same responses built with ``mask_injected=true``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base

from tests.unit.helpers import FakeTransferQueue
from verl_ext.rollout import gec
from verl_ext.trainer import legacy, v1

PROMPT = [5, 6, 7]
EOS = 2
WIDTH = 12  # the legacy trainer's response length
PARTITION = "train"
# the verl metrics that compare rollout and actor log-probs (verl's calculate_debug_metrics, compute_offpolicy_metrics)
DIAGNOSTICS = ("training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_std",
               "training/rollout_actor_probs_pearson_corr", "rollout_corr/kl", "rollout_corr/k3_kl",
               "rollout_corr/training_ppl", "rollout_corr/rollout_ppl", "rollout_corr/log_ppl_diff",
               "rollout_corr/log_ppl_diff_max", "rollout_corr/ppl_ratio", "rollout_corr/chi2_token",
               "rollout_corr/chi2_seq")


def _engine_logprobs(n: int, seed: int) -> list[float]:
    return (-torch.rand(n, generator=torch.Generator().manual_seed(seed)) * 2 - 0.05).tolist()


def _group(mask_injected: bool) -> list[dict]:
    """One group of four final responses as GEC's ``gec_agent`` assembles them: unedited, reflection (core, cue,
    continuation), answer (core, template, EOS), reference solution (solution, EOS). Per row: response ids, response
    mask, the engine's log-probs (0.0 on injected tokens), GEC's spans, its branch and how many tokens it injected."""
    core = gec.Segment([11, 12, 13], injected=False, logprobs=_engine_logprobs(3, 1), kind=gec.SPAN_POLICY)
    pieces = {
        gec.BRANCH_NONE: [gec.Segment([14, 15, 16, 17, EOS], injected=False, logprobs=_engine_logprobs(5, 2),
                                      kind=gec.SPAN_POLICY)],
        gec.BRANCH_REFLECT: [core, gec.Segment([20, 21], injected=True, kind=gec.SPAN_CUE),
                             gec.Segment([22, 23, 24, EOS], injected=False, logprobs=_engine_logprobs(4, 3),
                                         kind=gec.SPAN_CONTINUATION)],
        gec.BRANCH_ANSWER: [core, gec.Segment([30, 31, 32, 33], injected=True, kind=gec.SPAN_ANSWER),
                            gec.Segment([EOS], injected=True, kind=gec.SPAN_EOS)],
        gec.BRANCH_SOLUTION: [gec.Segment([40, 41, 42, 43, 44], injected=True, kind=gec.SPAN_SOLUTION),
                              gec.Segment([EOS], injected=True, kind=gec.SPAN_EOS)],
    }
    rows = []
    for branch, segments in pieces.items():
        built = gec.assemble_response(segments, response_length=WIDTH, mask_injected=mask_injected,
                                      with_logprobs=True)
        rows.append({"branch": branch, "ids": built.response_ids, "mask": built.response_mask,
                     "rollout": built.response_logprobs, "spans": built.spans, "injected": built.injected_tokens})
    return rows


def _actor_logprobs(row: dict, mismatch: float) -> torch.Tensor:
    """The actor's log-probs of a row's tokens: the engine's on every sampled token (plus ``mismatch`` on every
    other one of them: a stale weight, bf16), its own on the injected tokens (which the engine gave 0.0)."""
    out = torch.tensor(row["rollout"])
    for kind, start, end in row["spans"]:
        if kind in (gec.SPAN_POLICY, gec.SPAN_CONTINUATION):  # what the engine sampled
            out[start:end:2] += mismatch
        else:
            out[start:end] = -1.5
    return out


def _extra_fields(row: dict) -> dict:
    correct = row["branch"] == gec.BRANCH_NONE
    return {gec.KEY_BRANCH: row["branch"], gec.KEY_SCORE_BEFORE: float(correct), gec.KEY_CORRECT_BEFORE: correct,
            gec.KEY_CONTINUATION_TOKENS: 0, gec.KEY_INJECTED_TOKENS: row["injected"], gec.KEY_TRUNCATED: False,
            gec.KEY_RESPONSE_LEN_BEFORE: len(row["ids"]), gec.KEY_FIRST_HIT_CAP: False, gec.KEY_SPANS: row["spans"],
            gec.KEY_ERROR: "", "reward_extra_info": {"score": 1.0, "acc": 1.0}}


# ---------------------------------------------------------------- v1: verl's own old-log-prob and advantage steps


class _Actor:
    """The actor worker group's ``compute_log_prob``: writes per-token log-probs and entropy over prompt + response
    (a token's log-prob at the position before it, as verl's engine does)."""

    def __init__(self, store: FakeTransferQueue, actor_logprobs: dict[str, torch.Tensor]):
        self.store, self.actor_logprobs = store, actor_logprobs

    def compute_log_prob(self, batch):
        for key in batch.keys:
            response = self.actor_logprobs[key]
            full = torch.zeros(len(PROMPT) + len(response))
            full[len(PROMPT) - 1:-1] = response
            self.store.rows[key].update({"log_probs": full, "entropy": torch.full_like(full, 0.7)})
        return batch

    def save_model_to_cpu(self, n):  # separate_async keeps pi_old for its later mini-batches
        pass

    restore_model_from_cpu = clear_cpu_model = save_model_to_cpu


def _v1_step(monkeypatch, mask_injected: bool, mismatch: float, verls_own: bool, mode: str = "sync"):
    """verl's v1 old-log-prob and advantage steps on one GEC group (rollout.calculate_log_probs on, verl's default
    rollout correction: metrics only): verl_ext's trainer of v1 ``mode``, or verl's own methods on it
    (``verls_own``). Returns (metrics, the TransferQueue rows)."""
    store = FakeTransferQueue()
    for module in (trainer_base, v1):
        monkeypatch.setattr(module, "tq", store)
    keys, rows, actor = [], [], {}
    for session, row in enumerate(_group(mask_injected)):
        keys.append(f"g_{session}_0")
        response = torch.tensor(row["ids"])
        rm = torch.zeros(len(response))
        rm[-1] = float(session % 2)
        rows.append({"uid": "g", "data_source": "toy", "prompts": torch.tensor(PROMPT), "responses": response,
                     "response_mask": torch.tensor(row["mask"]), "rm_scores": rm,
                     "rollout_log_probs": torch.tensor(row["rollout"]), "extra_fields": _extra_fields(row)})
        actor[keys[-1]] = _actor_logprobs(row, mismatch)
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    batch = store.kv_batch_put(keys, PARTITION, list_of_dict_to_tensordict(rows), [{"global_steps": 1}] * len(keys))
    base = get_trainer_cls(mode)
    cls = v1.extended_trainer_cls(base)
    trainer = cls.__new__(cls)
    trainer.local_trigger_step = 1  # separate_async: a later mini-batch of its sync cycle
    trainer.config = OmegaConf.create({
        "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False,
                      "gamma": 1.0, "lam": 1.0, "gec": {"enable": True, "mask_injected": mask_injected},
                      "rollout_correction": {"rollout_is": None, "rollout_rs": None, "bypass_mode": False}},
        "actor_rollout_ref": {"rollout": {"n": len(keys), "temperature": 1.0, "calculate_log_probs": True},
                              "actor": {"loss_agg_mode": "token-mean", "loss_scale_factor": None}},
    })
    trainer.actor_rollout_wg = _Actor(store, actor)
    trainer.use_critic = False
    metrics: dict = {}
    if verls_own:
        batch = base._compute_old_log_prob(trainer, batch, metrics)
        trainer_base.PPOTrainer._compute_advantage(trainer, batch, metrics)
    else:
        batch = trainer._compute_old_log_prob(batch, metrics)
        trainer._compute_advantage(batch, metrics)
    return metrics, store.rows


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_v1_diagnostics_see_only_sampled_tokens_and_the_loss_inputs_stay_verls(monkeypatch, mode):
    """The engine's log-probs equal the actor's on every sampled token: verl's own step reports a difference of
    about 1 (the injected tokens' 0.0 read as probability 1), verl_ext's reports 0, in every v1 mode
    (``separate_async`` scores a later mini-batch with its kept pi_old through its own ``_compute_old_log_prob``).
    What the loss reads (old_log_probs, response_mask, advantages, the engine's rollout log-probs) is the same."""
    verl_metrics, verl_rows = _v1_step(monkeypatch, mask_injected=False, mismatch=0.0, verls_own=True, mode=mode)
    metrics, rows = _v1_step(monkeypatch, mask_injected=False, mismatch=0.0, verls_own=False, mode=mode)
    assert verl_metrics["training/rollout_probs_diff_max"] > 0.7 and verl_metrics["rollout_corr/kl"] > 0.5
    assert metrics["training/rollout_probs_diff_valid"] == 1
    for key in ("training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "rollout_corr/kl",
                "rollout_corr/k3_kl", "rollout_corr/log_ppl_diff", "rollout_corr/chi2_token"):
        assert metrics[key] == pytest.approx(0.0, abs=1e-6), key
    assert metrics["rollout_corr/ppl_ratio"] == pytest.approx(1.0, abs=1e-6)
    for key, row in rows.items():
        for field in ("old_log_probs", "entropy", "response_mask", "advantages", "rollout_log_probs"):
            assert torch.equal(row[field], verl_rows[key][field]), (key, field)
    # the continuation keeps the engine's log-probs, the injected tokens the 0.0 GEC gave them
    group = _group(mask_injected=False)
    for key, built in zip(sorted(rows), group):
        assert rows[key]["rollout_log_probs"].tolist() == pytest.approx(built["rollout"])
    trained = sum(sum(r["mask"]) for r in group)
    assert metrics["gec/injected_token_frac"] == pytest.approx(sum(r["injected"] for r in group) / trained)
    assert 0 < metrics["gec/injected_token_frac"] < 1


def test_v1_a_real_mismatch_reads_as_verl_reads_it_with_the_injected_tokens_masked(monkeypatch):
    """A real rollout/actor mismatch on sampled tokens is reported in full: verl_ext's figures equal verl's own for
    the same responses built with ``mask_injected=true``; and with ``mask_injected=true`` verl_ext changes nothing."""
    metrics, _ = _v1_step(monkeypatch, mask_injected=False, mismatch=-0.3, verls_own=False)
    masked_verl, _ = _v1_step(monkeypatch, mask_injected=True, mismatch=-0.3, verls_own=True)
    masked, _ = _v1_step(monkeypatch, mask_injected=True, mismatch=-0.3, verls_own=False)
    assert metrics["training/rollout_probs_diff_max"] > 0.05 and metrics["rollout_corr/kl"] > 0.05
    for key in DIAGNOSTICS:
        assert metrics[key] == pytest.approx(masked_verl[key], rel=1e-6, abs=1e-7), key
        assert masked[key] == masked_verl[key], key
    assert masked["gec/injected_token_frac"] == 0.0  # nothing injected is trained


# ---------------------------------------------------------------- legacy: as RayPPOTrainer.fit calls them


def _legacy_batch(mask_injected: bool, mismatch: float) -> DataProto:
    """The legacy trainer's batch after the old-log-prob pass: dense response fields at the response length, GEC's
    fields as flat columns (``AgentLoopWorker._postprocess``)."""
    group = _group(mask_injected)
    b = len(group)
    tensors = {name: torch.zeros(b, WIDTH) for name in ("rollout_log_probs", "old_log_probs")}
    tensors["responses"] = torch.zeros(b, WIDTH, dtype=torch.long)
    tensors["response_mask"] = torch.zeros(b, WIDTH, dtype=torch.long)
    tensors["attention_mask"] = torch.zeros(b, len(PROMPT) + WIDTH, dtype=torch.long)
    for i, row in enumerate(group):
        n = len(row["ids"])
        tensors["responses"][i, :n] = torch.tensor(row["ids"])
        tensors["response_mask"][i, :n] = torch.tensor(row["mask"])
        tensors["attention_mask"][i, :len(PROMPT) + n] = 1
        tensors["rollout_log_probs"][i, :n] = torch.tensor(row["rollout"])
        tensors["old_log_probs"][i, :n] = _actor_logprobs(row, mismatch)
    columns = [_extra_fields(row) for row in group]
    non_tensor = {key: np.array([c[key] for c in columns] + [None], dtype=object)[:-1] for key in gec.EXTRA_KEYS}
    non_tensor["uid"] = np.array(["g"] * b, dtype=object)
    return DataProto(batch=TensorDict(tensors, batch_size=b), non_tensor_batch=non_tensor)


def _legacy_diagnostics(monkeypatch, batch: DataProto, mask_injected: bool, verls_own: bool
                        ) -> tuple[dict, DataProto]:
    """What ``RayPPOTrainer.fit`` computes after the old-log-prob pass, called as fit calls it (importing each
    function from its module at the call), run as the body of verl's ``fit`` under verl_ext's ``fit`` (or, with
    ``verls_own``, under verl's)."""
    from verl.trainer.ppo import ray_trainer

    rollout_corr_config = {"rollout_is": None, "rollout_rs": None, "bypass_mode": False}

    def fit(self):
        from verl.utils.debug.metrics import calculate_debug_metrics

        metrics = calculate_debug_metrics(batch)
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

        out, is_metrics = compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config)
        return {**metrics, **is_metrics}, out

    with monkeypatch.context() as patch:
        patch.setattr(ray_trainer.RayPPOTrainer, "fit", fit)
        cls = ray_trainer.RayPPOTrainer if verls_own else legacy.ExtRayPPOTrainer
        trainer = cls.__new__(cls)
        trainer.config = OmegaConf.create({"algorithm": {"adv_estimator": "grpo",
                                                         "gec": {"enable": True, "mask_injected": mask_injected}}})
        return trainer.fit()


def test_legacy_diagnostics_see_only_sampled_tokens_and_the_loss_inputs_stay_verls(monkeypatch):
    batch = _legacy_batch(mask_injected=False, mismatch=0.0)
    mask = batch.batch["response_mask"].clone()
    verl_metrics, _ = _legacy_diagnostics(monkeypatch, batch, mask_injected=False, verls_own=True)
    metrics, out = _legacy_diagnostics(monkeypatch, batch, mask_injected=False, verls_own=False)
    assert verl_metrics["training/rollout_probs_diff_max"] > 0.7 and verl_metrics["rollout_corr/kl"] > 0.5
    for key in ("training/rollout_probs_diff_max", "rollout_corr/kl", "rollout_corr/k3_kl"):
        assert metrics[key] == pytest.approx(0.0, abs=1e-6), key
    assert torch.equal(out.batch["response_mask"], mask) and torch.equal(batch.batch["response_mask"], mask)
    # verl's functions are its own again after the block
    from verl.trainer.ppo import rollout_corr_helper
    from verl.utils.debug import metrics as debug_metrics

    assert debug_metrics.calculate_debug_metrics.__module__ == "verl.utils.debug.metrics"
    assert rollout_corr_helper.compute_offpolicy_metrics.__module__ == "verl.trainer.ppo.rollout_corr_helper"


def test_legacy_a_real_mismatch_reads_as_verl_reads_it_with_the_injected_tokens_masked(monkeypatch):
    metrics, _ = _legacy_diagnostics(monkeypatch, _legacy_batch(False, -0.3), mask_injected=False, verls_own=False)
    masked_verl, _ = _legacy_diagnostics(monkeypatch, _legacy_batch(True, -0.3), mask_injected=True, verls_own=True)
    masked, _ = _legacy_diagnostics(monkeypatch, _legacy_batch(True, -0.3), mask_injected=True, verls_own=False)
    assert metrics["training/rollout_probs_diff_max"] > 0.05
    for key in DIAGNOSTICS:
        assert metrics[key] == pytest.approx(masked_verl[key], rel=1e-6, abs=1e-7), key
        assert masked[key] == masked_verl[key], key


def test_a_step_of_reference_solutions_only_has_no_off_policy_figures(monkeypatch):
    """No token of the step was sampled (every response replaced by its reference solution): verl's off-policy
    function, which requires a token, is not called; verl's debug metrics say the input is not valid."""
    batch = _legacy_batch(mask_injected=False, mismatch=0.0)[[3]]
    metrics, _ = _legacy_diagnostics(monkeypatch, batch, mask_injected=False, verls_own=False)
    assert metrics["training/rollout_probs_diff_valid"] == 0
    assert not [k for k in metrics if k.startswith("rollout_corr/")]


def test_injected_token_frac_counts_trained_injected_tokens_only():
    from verl_ext.trainer.rollout_diagnostics import injected_token_frac

    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    spans = [[["policy", 0, 2], ["cue", 2, 3], ["continuation", 3, 4]], None]
    assert injected_token_frac(mask, spans) == pytest.approx(1 / 6)
    assert injected_token_frac(torch.zeros(2, 5, dtype=torch.long), spans) == 0.0
    with pytest.raises(ValueError, match="spans of 1 rows"):
        injected_token_frac(mask, spans[:1])


def test_the_trainers_checks_name_the_diagnostics_verl_ext_rebinds(monkeypatch):
    """A verl whose v1 old-log-prob step no longer calls ``calculate_debug_metrics`` through its module global (the
    name verl_ext rebinds), or whose rollout correction computes its off-policy figures another way, is refused at
    start-up, naming the function."""
    from verl.trainer.ppo import rollout_corr_helper

    from verl_ext import verl_compat

    def old_log_prob_without_debug_metrics(self, batch, metrics):
        fields = ["entropy", "log_probs", "response_mask"]
        return batch, fields

    def rejection_mask_without_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask, **kwargs):
        return None, response_mask, {}

    monkeypatch.setattr(trainer_base.PPOTrainer, "_compute_old_log_prob", old_log_prob_without_debug_metrics)
    with pytest.raises(verl_compat.VerlCompatError, match="_compute_old_log_prob using 'calculate_debug_metrics'"):
        verl_compat.check_v1_trainer()
    monkeypatch.undo()
    monkeypatch.setattr(rollout_corr_helper, "compute_rollout_correction_and_rejection_mask",
                        rejection_mask_without_offpolicy_metrics)
    with pytest.raises(verl_compat.VerlCompatError, match="using 'compute_offpolicy_metrics'"):
        verl_compat.check_legacy_trainer()

"""v1's advantage step: verl's padding rows (``padding_utils.upsample_batch_to_divisible_size``) enter no verl_ext
statistic; ``rollout_correction.bypass_mode`` (no entropy fetched) runs the estimators that need none.

The batch is padded by verl's own function and the advantage step is verl's own ``PPOTrainer._compute_advantage``
(with verl_ext's routing); only TransferQueue is an in-memory stand-in (``FakeTransferQueue``: per-key rows in, verl's
``list_of_dict_to_tensordict`` layout out, as the real client returns them).
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import padding_utils
from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from verl_ext.rollout import gec
from verl_ext.trainer import v1

EOS = 2
N = 4  # rollout.n
PARTITION = "train"


class FakeTransferQueue:
    """The three calls verl's padding and advantage code and verl_ext's v1 glue make, on an in-memory store."""

    def __init__(self):
        self.rows: dict[str, dict] = {}
        self.tags: dict[str, dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        for i, key in enumerate(keys):
            row = self.rows.setdefault(key, {})
            if fields is not None:
                item = fields[i]
                row.update({name: item[name] for name in fields.keys()})
            if tags is not None:
                self.tags[key] = dict(tags[i])
        return trainer_base.KVBatchMeta(keys=list(keys), tags=[self.tags.get(k, {}) for k in keys],
                                        partition_id=partition_id)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        rows = [self.rows[k] for k in keys]
        names = list(rows[0]) if select_fields is None else [f for f in select_fields if f in rows[0]]
        for name in names:
            assert all(name in r for r in rows), f"field {name} not ready in every row"
        return list_of_dict_to_tensordict([{name: r[name] for name in names} for r in rows])


def _row(uid: str, session: int, response_len: int, score: float, source: str, correct_before: bool) -> dict:
    prompt = torch.full((5,), 7, dtype=torch.int64)
    response = torch.arange(10, 10 + response_len, dtype=torch.int64)
    rm = torch.zeros(response_len)
    rm[-1] = score
    input_ids = torch.cat([prompt, response])
    return {
        "uid": uid, "session_id": session, "data_source": source,
        "prompts": prompt, "responses": response, "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids), "position_ids": torch.arange(input_ids.numel()),
        "response_mask": torch.ones(response_len, dtype=torch.int64), "rm_scores": rm,
        "rollout_log_probs": -torch.full((response_len,), 0.5),
        "extra_fields": {
            gec.KEY_BRANCH: gec.BRANCH_NONE if correct_before else gec.BRANCH_ANSWER,
            gec.KEY_SCORE_BEFORE: float(correct_before), gec.KEY_CORRECT_BEFORE: correct_before,
            gec.KEY_CONTINUATION_TOKENS: 0, gec.KEY_INJECTED_TOKENS: 0 if correct_before else 3,
            gec.KEY_TRUNCATED: False, gec.KEY_RESPONSE_LEN_BEFORE: response_len, gec.KEY_FIRST_HIT_CAP: False,
            "reward_extra_info": {"score": score, "acc": score},
        },
    }


def _batch(store: FakeTransferQueue, multiple: int, bypass: bool = False, error: str = ""):
    """Three groups of N (one collapsed, one all wrong before GEC), padded by verl to a multiple of ``multiple``,
    then the old-log-prob pass's fields for every row (padding included, as verl's actor computes them)."""
    gen = torch.Generator().manual_seed(0)
    keys, tags = [], []
    rows = []
    for g, (scores, before) in enumerate((([1, 0, 1, 0], [1, 0, 1, 0]), ([1, 1, 1, 1], [1, 1, 1, 1]),
                                          ([1, 0, 0, 0], [0, 0, 0, 0]))):
        for s in range(N):
            length = int(torch.randint(2, 7, (1,), generator=gen))
            rows.append(_row(f"u{g}", s, length, float(scores[s]), ["a", "b", "a"][g], bool(before[s])))
            rows[-1]["extra_fields"][gec.KEY_ERROR] = error if (g, s) == (2, 1) else ""
            keys.append(f"u{g}_{s}_0")
            tags.append({"status": "success", "prompt_len": 5, "response_len": length, "seq_len": 5 + length,
                         "global_steps": 1})
    store.kv_batch_put(keys, PARTITION, list_of_dict_to_tensordict(rows), tags)
    batch = padding_utils.upsample_batch_to_divisible_size(
        trainer_base.KVBatchMeta(keys=keys, tags=tags, partition_id=PARTITION), multiple, EOS)
    old = []
    for key in batch.keys:  # the old-log-prob pass writes entropy / old_log_probs for every row
        length = store.rows[key]["responses"].numel()
        if bypass:  # verl's _compute_old_log_prob in bypass mode: the rollout's log-probs, no entropy
            old.append({"old_log_probs": store.rows[key]["rollout_log_probs"].clone()})
            continue
        old.append({"old_log_probs": -torch.rand(length, generator=gen) - 0.1,
                    "entropy": torch.rand(length, generator=gen) + 0.2})
    store.kv_batch_put(batch.keys, PARTITION, list_of_dict_to_tensordict(old))
    return batch


def _trainer(estimator="gepo", bypass=False, **gepo):
    cls = v1.extended_trainer_cls(get_trainer_cls("sync"))
    trainer = cls.__new__(cls)
    trainer.config = OmegaConf.create({
        "algorithm": {"adv_estimator": estimator, "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False,
                      "gamma": 1.0, "lam": 1.0, "gepo": {"stats_scope": "per_data_source", **gepo},
                      "gec": {"enable": True}, "rollout_correction": {"bypass_mode": bypass}},
        "actor_rollout_ref": {"rollout": {"n": N}},
    })
    return trainer


def _step(monkeypatch, multiple: int, estimator="gepo", bypass=False, error="", **gepo):
    store = FakeTransferQueue()
    for module in (padding_utils, trainer_base, v1):
        monkeypatch.setattr(module, "tq", store)
    batch = _batch(store, multiple, bypass, error)
    trainer = _trainer(estimator, bypass, **gepo)
    metrics: dict = {}
    batch = trainer._compute_advantage(batch, metrics)
    adv = {k: store.rows[k]["advantages"] for k in batch.keys}
    return batch, metrics, adv, trainer.entropy_history.state_dict()


def ours(metrics: dict) -> dict:
    """verl_ext's metrics (verl's own, e.g. rollout_corr/*, are verl's business)."""
    return {k: v for k, v in metrics.items() if k.split("/")[0] in ("gec", "gepo", "edge_grpo", "verl_ext")}


@pytest.mark.parametrize("gepo", [{"entropy_estimator": "sum_mean"}, {"base": "edge_grpo"}])
def test_verls_padding_rows_enter_no_statistic_and_keep_advantage_zero(monkeypatch, gepo):
    """12 rows padded to 16 by verl (as on 8 data-parallel ranks): every metric, the GEPO history and the real rows'
    advantages are those of the unpadded batch; the padding rows' advantages are 0. With ``sum_mean`` a padding
    group has a finite H_g = 0, which would move mu/sigma and the thresholds."""
    plain, plain_metrics, plain_adv, plain_history = _step(monkeypatch, 1, **gepo)
    padded, metrics, adv, history = _step(monkeypatch, 8, **gepo)
    pads = [k for k, tag in zip(padded.keys, padded.tags) if tag.get("is_padding")]
    assert len(padded) == 16 and len(pads) == 4  # verl padded the batch
    assert ours(metrics) == pytest.approx(ours(plain_metrics), nan_ok=True) and len(ours(metrics)) > 30
    assert history == plain_history
    for key in plain.keys:
        torch.testing.assert_close(adv[key], plain_adv[key])
    for key in pads:
        assert torch.count_nonzero(adv[key]) == 0
    assert metrics["gec/groups"] == 3 and metrics["verl_ext/groups_all_wrong_frac"] == pytest.approx(1 / 3)
    assert metrics["verl_ext/empty_response_count"] == 0 and metrics["verl_ext/singleton_group_count"] == 0


def test_real_rows_reads_verls_padding_tag():
    assert v1.real_rows([{"status": "success"}, {"is_padding": True}, {}]).tolist() == [True, False, True]


@pytest.mark.parametrize("estimator", ["gepo", "grpo"])
def test_bypass_mode_runs_the_estimators_that_need_no_entropy(monkeypatch, estimator):
    """``rollout_correction.bypass_mode=true``: no entropy is fetched (verl skipped that pass); gepo's token_mean reads
    the rollout log-probs verl put in old_log_probs, and the step's diagnostics go without the entropy ones."""
    _, metrics, adv, history = _step(monkeypatch, 8, estimator=estimator, bypass=True)
    assert "verl_ext/response_entropy_mean" not in metrics and metrics["verl_ext/collapsed_group_frac"] == 1 / 3
    assert any(torch.count_nonzero(a) for a in adv.values())
    if estimator == "gepo":
        assert metrics["gepo/a/H_mean"] == pytest.approx(0.5)  # every rollout log-prob is -0.5
        assert sorted(history["scopes"]) == ["a", "b"]


def test_a_step_with_unusable_gec_rows_stops_before_training(monkeypatch):
    """One of 12 GEC rows had no ground truth for its drawn answer (``gec_error``): the v1 step raises (default
    ``max_error_frac`` 0) instead of v1's logged-and-dropped failed session."""
    from verl_ext.trainer.gec_metrics import GecRolloutError

    with pytest.raises(GecRolloutError, match=r"1 of 12 training rollouts"):
        _step(monkeypatch, 8, error="the row has no reward_model.ground_truth")

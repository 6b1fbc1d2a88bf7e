"""v1's advantage step: verl's padding rows (``padding_utils.upsample_batch_to_divisible_size``) enter no verl_ext
statistic; ``rollout_correction.bypass_mode`` (no entropy fetched) runs the estimators that need none.

The batch is padded by verl's own function and the advantage step is verl's own ``PPOTrainer._compute_advantage``
(with verl_ext's routing); only TransferQueue is an in-memory stand-in (``FakeTransferQueue``: per-key rows in, verl's
``list_of_dict_to_tensordict`` layout out, as the real client returns them).
"""

from __future__ import annotations

import json
import zlib

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import padding_utils
from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

import verl_ext.algos.registry  # noqa: F401  (registers the estimators)
from tests.unit.helpers import FakeTransferQueue
from verl_ext.rollout import gec
from verl_ext.trainer import v1

EOS = 2
N = 4  # rollout.n
PARTITION = "train"


def _row(uid: str, session: int, response_len: int, score: float, source: str, correct_before: bool,
         edit_spans: bool = False) -> dict:
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
            gec.KEY_SPANS: _spans(response_len, edited=edit_spans and not correct_before),
            "reward_extra_info": {"score": score, "acc": score},
        },
    }


def _spans(response_len: int, edited: bool) -> list:
    """The response as one policy span, or (an answer edit) the policy's first half, the template and EOS."""
    if not edited:
        return [(gec.SPAN_POLICY, 0, response_len)]
    half = response_len // 2
    return [(gec.SPAN_POLICY, 0, half), (gec.SPAN_ANSWER, half, response_len - 1),
            (gec.SPAN_EOS, response_len - 1, response_len)]


def _batch(store: FakeTransferQueue, multiple: int, bypass: bool = False, error: str = "", outputs: int = 1,
           prefix: str = "", edit_spans: bool = False):
    """Three groups of N (one collapsed, one all wrong before GEC), padded by verl to a multiple of ``multiple``,
    then the old-log-prob pass's fields for every row (padding included, as verl's actor computes them).

    ``outputs`` > 1: sample 1 of group 0 returns that many outputs (keys ``u0_1_0``, ``u0_1_1``, ...); the last is
    the row a one-output batch has, the earlier ones differ from it (length, score, entropy). ``prefix``: of the uids
    (another mini-batch of the step)."""
    gen = torch.Generator().manual_seed(0)
    keys, tags = [], []
    rows = []
    seeds = {}  # the old-log-prob fields follow the row, not its key: the last output draws the one-output row's
    for g, (scores, before) in enumerate((([1, 0, 1, 0], [1, 0, 1, 0]), ([1, 1, 1, 1], [1, 1, 1, 1]),
                                          ([1, 0, 0, 0], [0, 0, 0, 0]))):
        for s in range(N):
            length = int(torch.randint(2, 7, (1,), generator=gen))
            several = outputs if (g, s) == (0, 1) else 1
            for o in range(several):
                last = o == several - 1
                rows.append(_row(f"{prefix}u{g}", s, length if last else 7 + o, float(scores[s] if last else 1 - scores[s]),
                                 ["a", "b", "a"][g], bool(before[s]), edit_spans))
                rows[-1]["extra_fields"][gec.KEY_ERROR] = error if (g, s) == (2, 1) else ""
                keys.append(f"{prefix}u{g}_{s}_{o}")
                seeds[keys[-1]] = zlib.crc32(f"u{g}_{s}".encode()) if last else 1000 + o
                tags.append({"status": "success", "prompt_len": 5, "response_len": rows[-1]["responses"].numel(),
                             "seq_len": 5 + rows[-1]["responses"].numel(), "global_steps": 1})
    store.kv_batch_put(keys, PARTITION, list_of_dict_to_tensordict(rows), tags)
    batch = padding_utils.upsample_batch_to_divisible_size(
        trainer_base.KVBatchMeta(keys=keys, tags=tags, partition_id=PARTITION), multiple, EOS)
    old = []
    for key in batch.keys:  # the old-log-prob pass writes entropy / old_log_probs for every row
        length = store.rows[key]["responses"].numel()
        if bypass:  # verl's _compute_old_log_prob in bypass mode: the rollout's log-probs, no entropy
            old.append({"old_log_probs": store.rows[key]["rollout_log_probs"].clone()})
            continue
        draw = torch.Generator().manual_seed(seeds.get(key, 7))
        old.append({"old_log_probs": -torch.rand(length, generator=draw) - 0.1,
                    "entropy": torch.rand(length, generator=draw) + 0.2})
    store.kv_batch_put(batch.keys, PARTITION, list_of_dict_to_tensordict(old))
    return batch


def _trainer(estimator="gepo", bypass=False, edge_grpo=None, gec_options=None, **gepo):
    cls = v1.extended_trainer_cls(get_trainer_cls("sync"))
    trainer = cls.__new__(cls)
    trainer.config = OmegaConf.create({
        "algorithm": {"adv_estimator": estimator, "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False,
                      "gamma": 1.0, "lam": 1.0, "gepo": {"stats_scope": "per_data_source", **gepo},
                      "edge_grpo": edge_grpo or {},
                      "gec": {"enable": True, **(gec_options or {})}, "rollout_correction": {"bypass_mode": bypass}},
        "actor_rollout_ref": {"rollout": {"n": N}},
    })
    return trainer


def _store(monkeypatch) -> FakeTransferQueue:
    store = FakeTransferQueue()
    for module in (padding_utils, trainer_base, v1):
        monkeypatch.setattr(module, "tq", store)
    return store


def _run(monkeypatch, multiple: int, estimator="gepo", bypass=False, error="", outputs=1, edge_grpo=None, **gepo):
    """One advantage step; returns (batch, metrics, the TransferQueue store, the trainer)."""
    store = _store(monkeypatch)
    batch = _batch(store, multiple, bypass, error, outputs)
    trainer = _trainer(estimator, bypass, edge_grpo, **gepo)
    metrics: dict = {}
    batch = trainer._compute_advantage(batch, metrics)
    return batch, metrics, store, trainer


def _step(monkeypatch, multiple: int, estimator="gepo", bypass=False, error="", **gepo):
    batch, metrics, store, trainer = _run(monkeypatch, multiple, estimator, bypass, error, **gepo)
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


MULTI = [("gepo", None, {"entropy_estimator": "sum_mean"}), ("gepo", None, {"base": "edge_grpo"}),
         ("edge_grpo", {"entropy_grad": True}, {})]


@pytest.mark.parametrize(("estimator", "edge_grpo", "gepo"), MULTI)
def test_a_multi_output_sample_counts_once_and_its_outputs_share_the_last_ones_advantage(
        monkeypatch, estimator, edge_grpo, gepo):
    """Sample 1 of group 0 returned three outputs (``u0_1_0..2``): as verl's GRPO on the v1 trainer, only the last
    enters the group (size N, H̄_g, GEPO's one history update) and the earlier two get its advantage. Everything
    verl_ext logs, the history and the other rows' advantages are those of the one-output batch."""
    plain, plain_metrics, plain_store, plain_trainer = _run(monkeypatch, 8, estimator, edge_grpo=edge_grpo, **gepo)
    multi, metrics, store, trainer = _run(monkeypatch, 8, estimator, outputs=3, edge_grpo=edge_grpo, **gepo)
    assert ours(metrics) == pytest.approx(ours(plain_metrics), nan_ok=True)
    assert trainer.entropy_history.state_dict() == plain_trainer.entropy_history.state_dict()
    renamed = {"u0_1_0": "u0_1_2"}  # the one-output row is the last output here
    for key in (k for k, tag in zip(plain.keys, plain.tags) if not tag.get("is_padding")):
        for field in ("advantages", *(f for f in (v1.EDA_H_BAR_KEY, v1.EDA_H_OLD_KEY) if f in plain_store.rows[key])):
            torch.testing.assert_close(store.rows[renamed.get(key, key)][field], plain_store.rows[key][field])
    last = store.rows["u0_1_2"]["advantages"]
    assert torch.count_nonzero(last) > 0
    for key in ("u0_1_0", "u0_1_1"):
        copy = store.rows[key]["advantages"]
        assert copy.numel() != last.numel()
        torch.testing.assert_close(copy, torch.full_like(copy, float(last[0])))
        if v1.EDA_H_OLD_KEY in store.rows[key]:  # H_i(old) = 0: the loss keeps the copied advantage as it is
            assert float(store.rows[key][v1.EDA_H_OLD_KEY]) == 0.0
    assert sum(tag.get("is_padding", False) for tag in multi.tags) == 2


def test_counts_add_up_over_the_mini_steps_of_a_step(monkeypatch):
    """``parameter_sync_step=2`` (e.g. separate_async): verl's ``step`` folds the two mini-steps' metrics with its
    ``MetricsAggregator``, which averages; a count is the step's sum, a share stays a share."""
    _, single, _, _ = _step(monkeypatch, 8, base="edge_grpo")
    store = _store(monkeypatch)
    trainer = _trainer("gepo", base="edge_grpo")
    trainer.config = OmegaConf.merge(trainer.config, {"data": {"train_batch_size": 24}})
    trainer.parameter_sync_step = 2
    trainer.prepare_step = dict
    trainer._step_once = lambda metrics, timing_raw, size: trainer._compute_advantage(
        _batch(store, 8, prefix=f"m{trainer.local_trigger_step}"), metrics)
    metrics: dict = {}
    trainer.step(metrics, {})
    for key in ("gec/count/answer", "gec/count/none", "gec/responses", "gec/groups", "gec/injected_tokens",
                "gec/groups_all_wrong_before", "gec/errors", "gec/truncated", "edge_grpo/unscaled_count"):
        assert metrics[key] == 2 * single[key], key
    assert metrics["gec/count/answer"] == 12
    for key in ("gec/acc_before", "gec/frac_edited", "verl_ext/groups_all_wrong_frac", "verl_ext/a/groups_all_wrong_frac"):
        assert metrics[key] == pytest.approx(single[key]), key


def test_verl_ext_metric_names_decide_their_step_aggregation():
    """verl's aggregator picks by keywords anywhere in a name; verl_ext's counts sum, GEPO's update count is the
    last, and a data source in a name ("minerva" has "min") does not turn a mean into a minimum."""
    aggregator = v1.step_metrics_aggregator()()
    for value in (1.0, 3.0):
        aggregator.add_step_metrics({"gec/errors": value, "gec/count/reflect": value, "edge_grpo/unscaled_count": value,
                                     "gepo/warmup_batches": value, "gepo/minerva/H_mean": value,
                                     "edge_grpo/factor_max": value, "actor/pg_loss": value}, sample_count=4)
    out = aggregator.get_aggregated_metrics()
    assert out == {"gec/errors": 4.0, "gec/count/reflect": 4.0, "edge_grpo/unscaled_count": 4.0,
                   "gepo/warmup_batches": 3.0, "gepo/minerva/H_mean": 2.0, "edge_grpo/factor_max": 3.0,
                   "actor/pg_loss": 2.0}


class _Tokenizer:
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(t)) for t in ids if int(t) != EOS)

    def batch_decode(self, pieces, skip_special_tokens=True):
        return [self.decode(p) for p in pieces]


def test_padding_rows_carry_no_gec_columns_in_the_rollout_dump(monkeypatch, tmp_path):
    """verl's padding rows copy row 0's ``extra_fields`` and ``data_source``: in verl's dump (written by verl's own
    ``_log_rollout_data`` / ``_dump_generations``) their GEC columns are empty, so ``report --samples`` skips them."""
    store = _store(monkeypatch)
    batch = _batch(store, 8)
    trainer = _trainer("gepo")
    trainer.tokenizer, trainer.global_steps = _Tokenizer(), 1
    trainer._init_dump_executor()
    trainer._log_rollout_data(batch, {}, str(tmp_path))
    trainer._shutdown_dump_executor()
    lines = {row["uid"]: row for row in map(json.loads, (tmp_path / "1.jsonl").read_text().splitlines())}
    pads = [k for k, tag in zip(batch.keys, batch.tags) if tag.get("is_padding")]
    assert len(lines) == 16 and len(pads) == 4
    gec_keys = ("gec_branch", "gec_score_before", "gec_correct_before", "gec_first_response", "gec_segments",
                "gec_group", "data_source")
    for key in pads:
        assert all(lines[key][k] is None for k in gec_keys), lines[key]
    assert lines["u0_0_0"]["gec_branch"] == gec.BRANCH_NONE and lines["u0_0_0"]["data_source"] == "a"


def test_the_v1_glue_checks_pass_on_installed_verl():
    from verl_ext import verl_compat

    verl_compat.check_v1_multi_output.cache_clear()
    verl_compat.check_v1_multi_output()
    verl_compat.check_v1_step_metrics()


def test_a_verl_that_picks_other_outputs_is_refused(monkeypatch):
    """If verl's multi-output rule changed (here: every output its own group member), the start-up check says so."""
    from verl.trainer.ppo.v1 import utils

    from verl_ext import verl_compat

    monkeypatch.setattr(utils, "compute_advantage_for_multi_trajectories",
                        lambda data, keys, estimator, **kwargs: utils.compute_advantage(data, estimator))
    verl_compat.check_v1_multi_output.cache_clear()
    try:
        with pytest.raises(verl_compat.VerlCompatError, match="last output"):
            verl_compat.check_v1_multi_output()
    finally:
        verl_compat.check_v1_multi_output.cache_clear()


@pytest.mark.parametrize("estimator", ["grpo", "gepo"])  # verl's own estimator and one of verl_ext's
def test_credit_options_on_v1_act_on_the_edited_real_rows_and_reach_the_loss(monkeypatch, estimator):
    """prefix_advantage=before: the first attempts' tokens of the all-wrong group (r0 = 0 for all: Â(r0) = 0) get 0,
    those of the mixed group (r0 = r1 there) keep their advantage, the edit's tokens keep Â(r1); injected_loss=shaped:
    the answer and EOS tokens of the edited real rows are marked in TransferQueue for the actor loss."""
    from verl_ext.trainer.gec_advantage import OFF_POLICY_MASK_KEY

    results = {}
    for name, options in (("paper", {}), ("credit", {"prefix_advantage": "before", "injected_loss": "shaped"})):
        store = _store(monkeypatch)
        batch = _batch(store, 16, edit_spans=True)  # 12 rows padded to 16
        trainer = _trainer(estimator, gec_options=options)
        metrics: dict = {}
        batch = trainer._compute_advantage(batch, metrics)
        results[name] = (batch, store, metrics, trainer)
    batch, store, metrics, trainer = results["credit"]
    paper_batch, paper_store = results["paper"][:2]
    real = v1.real_rows(batch.tags)
    for key, paper_key, is_real in zip(batch.keys, paper_batch.keys, real):  # padding rows: fresh keys per run
        row, adv, paper = store.rows[key], store.rows[key]["advantages"], paper_store.rows[paper_key]["advantages"]
        spans = row["extra_fields"][gec.KEY_SPANS] if isinstance(row["extra_fields"], dict) else None
        edited = is_real and row["extra_fields"][gec.KEY_BRANCH] == gec.BRANCH_ANSWER
        n = row["responses"].numel()
        half = n // 2 if edited else 0
        off = row[OFF_POLICY_MASK_KEY][:n]
        if not edited:
            assert torch.equal(adv, paper) and off.sum() == 0, key
            continue
        assert spans is None or spans[0][2] == half
        all_wrong_group = key.startswith("u2_")
        expected_prefix = torch.zeros(half) if all_wrong_group else paper[:half]
        assert torch.allclose(adv[:half], expected_prefix, atol=1e-6), key
        assert torch.equal(adv[half:], paper[half:]), key
        assert off.tolist() == [0.0] * half + [1.0] * (n - half), key
    assert metrics["gec/credit/prefix_token_count"] > 0 and metrics["gec/credit/off_policy_token_count"] > 0
    if estimator == "gepo":  # one update of the history per step, the r0 pass aside
        assert trainer.entropy_history.state_dict() == results["paper"][3].entropy_history.state_dict()
    else:  # verl's own advantage: verl_ext's step diagnostics and GEC's metrics, none of its estimators' metrics
        paper_metrics = ours(results["paper"][2])
        assert {"verl_ext/collapsed_group_frac", "verl_ext/adv_var", "verl_ext/response_entropy_mean",
                "gec/acc_before"} <= set(paper_metrics)
        assert not any(k.startswith(("edge_grpo/", "gepo/")) for k in paper_metrics)

"""GEC's trainer-side step metrics (verl_ext.trainer.gec_metrics) on hand-built batches of both trainers' layouts."""

from __future__ import annotations

import numpy as np
import pytest

from verl_ext.trainer.gec_metrics import all_wrong_group_metrics, gec_step_metrics


def _hand_batch():
    # group a: all wrong before, one answer injection fixes one -> rescued
    # group b: mixed before, stays mixed; group c: all wrong, reflection fails -> still collapsed
    uid = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    branch = ["answer", "reflect", "none", "solution_fallback", "reflect", "gated"]
    before = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    final = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    cont = [0, 12, 0, 0, 30, 0]
    trunc = [False, False, False, False, True, False]
    rows = [
        {"gec_branch": b, "gec_score_before": s, "gec_correct_before": s >= 1.0, "gec_continuation_tokens": c,
         "gec_injected_tokens": 5 if b != "none" and b != "gated" else 0, "gec_truncated": t,
         "gec_response_len_before": 10}
        for b, s, c, t in zip(branch, before, cont, trunc)
    ]
    return uid, final, rows


def _check_metrics(m):
    assert m["gec/responses"] == 6
    assert m["gec/acc_before"] == pytest.approx(1 / 6)
    assert m["gec/acc_after"] == pytest.approx(3 / 6)
    assert m["gec/reward_before"] == pytest.approx(1 / 6)
    assert m["gec/reward_after"] == pytest.approx(0.5)
    assert m["gec/count/answer"] == 1 and m["gec/count/reflect"] == 2 and m["gec/count/none"] == 1
    assert m["gec/count/solution_fallback"] == 1 and m["gec/count/gated"] == 1 and m["gec/count/solution"] == 0
    assert m["gec/frac_edited"] == pytest.approx(4 / 6)
    assert m["gec/continuation_tokens"] == 42 and m["gec/continuation_tokens_mean"] == 21
    assert m["gec/truncated"] == 1 and m["gec/injected_tokens"] == 20
    assert m["gec/groups"] == 3 and m["gec/groups_all_wrong_before"] == 2 and m["gec/groups_rescued"] == 1
    assert m["gec/groups_collapsed_before"] == 2 and m["gec/groups_collapsed_after"] == 2
    assert all(k.startswith("gec/") for k in m)


def test_gec_step_metrics_flat_columns():
    uid, final, rows = _hand_batch()
    ntb = {k: np.array([r[k] for r in rows], dtype=object) for k in rows[0]}
    ntb["uid"] = uid
    _check_metrics(gec_step_metrics(ntb, uid, final, correct_threshold=1.0))


def test_gec_step_metrics_v1_extra_fields_and_torch():
    import torch

    uid, final, rows = _hand_batch()
    extra = np.empty(len(rows), dtype=object)
    extra[:] = rows
    _check_metrics(gec_step_metrics({"extra_fields": extra}, list(uid), torch.tensor(final)))


def test_gec_step_metrics_acc_after_from_reward_acc():
    """Final correctness from the final reward's acc (1 + accuracy scale: every final score is >= 1)."""
    uid, final, rows = _hand_batch()
    final_scaled = final + 1.0
    acc = final.copy()
    # legacy: reward-extra keys are columns
    ntb = {k: np.array([r[k] for r in rows], dtype=object) for k in rows[0]}
    ntb["score"], ntb["acc"] = final_scaled, acc
    m = gec_step_metrics(ntb, uid, final_scaled, correct_threshold=1.0)
    assert m["gec/acc_after"] == pytest.approx(3 / 6) and m["gec/groups_rescued"] == 1
    # v1: reward_extra_info inside each row's extra_fields
    extra = np.empty(len(rows), dtype=object)
    extra[:] = [{**r, "reward_extra_info": {"score": s, "acc": a}} for r, s, a in zip(rows, final_scaled, acc)]
    m = gec_step_metrics({"extra_fields": extra}, list(uid), final_scaled, correct_threshold=1.0)
    assert m["gec/acc_after"] == pytest.approx(3 / 6) and m["gec/groups_rescued"] == 1
    # without acc the threshold decides (and, on this scale, cannot separate: the reason acc is preferred)
    ntb.pop("acc")
    assert gec_step_metrics(ntb, uid, final_scaled, correct_threshold=1.0)["gec/acc_after"] == 1.0


def test_gec_step_metrics_without_gec_rows():
    assert gec_step_metrics({"uid": np.array(["a"])}, ["a"], [1.0]) == {}
    ntb = {"gec_branch": np.array([None, None], dtype=object)}
    assert gec_step_metrics(ntb, ["a", "a"], [1.0, 0.0]) == {}


def test_all_wrong_groups_before_correction_per_data_source():
    """GEC rows: the recorded first-response outcome decides (a rescued group still counts as all wrong)."""
    uid, final, rows = _hand_batch()  # a: all wrong (rescued), b: mixed, c: all wrong
    sources = ["two", "two", "one", "one", "two", "two"]
    extra = np.empty(len(rows), dtype=object)
    extra[:] = rows
    m = all_wrong_group_metrics({"extra_fields": extra}, uid, final, sources)
    assert m == {"verl_ext/groups_all_wrong_frac": pytest.approx(2 / 3), "verl_ext/two/groups_all_wrong_frac": 1.0,
                 "verl_ext/one/groups_all_wrong_frac": 0.0}
    # GEC off (no gec_* fields): the final reward's acc, else score >= threshold, decides
    ntb = {"score": final, "acc": np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])}
    m = all_wrong_group_metrics(ntb, uid, final, sources)
    assert m["verl_ext/two/groups_all_wrong_frac"] == 1.0 and m["verl_ext/one/groups_all_wrong_frac"] == 0.0
    m = all_wrong_group_metrics({}, uid, final, None)
    assert m == {"verl_ext/groups_all_wrong_frac": pytest.approx(1 / 3)}  # only c has no final score of 1
    with pytest.raises(ValueError, match="uids"):
        all_wrong_group_metrics({}, uid[:2], final, None)


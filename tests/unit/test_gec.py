"""Guided Error Correction / +Force-R (verl_ext.rollout): pure logic and the gec_agent loop with a fake server.

The agent loop runs verl's real SingleTurnAgentLoop code, verl's real reward manager (a custom reward function
file written here) and, for validation detection, verl's real AgentLoopWorker._run_agent_loop.
"""

from __future__ import annotations

import asyncio
import random
import types
from collections import Counter

import numpy as np
import pytest
from omegaconf import OmegaConf

from verl_ext.config import GecConfig
from verl_ext.rollout import gec
from verl_ext.rollout.gec import gec_step_metrics

REWARD_FN = '''
import re
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    boxes = re.findall(r"\\\\boxed\\{([^{}]*)\\}", solution_str)
    return 1.0 if boxes and boxes[-1].strip() == str(ground_truth).strip() else 0.0
'''

FIRST_WRONG = "The sum is \\boxed{4}"
FIRST_RIGHT = "The sum is \\boxed{5}"
CONTINUATION = " Recheck: 2+3 is \\boxed{5}"
SOLUTION = "2+3=5, so \\boxed{5}"


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tok():
    from verl_ext.toy.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def reward_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gec_reward") / "reward.py"
    path.write_text(REWARD_FN)
    return str(path)


@pytest.fixture(scope="module")
def verl_loop():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    import verl_ext.rollout.gec_agent_loop as module

    return module, _agent_loop_registry


class FakeServer:
    """Stands in for verl's LLMServerClient: first call -> ``first``, calls after a cue -> ``continuation``."""

    def __init__(self, tok, first=FIRST_WRONG, continuation=CONTINUATION, logprobs=True, stop_continuation=True):
        self.tok, self.first, self.continuation = tok, first, continuation
        self.logprobs, self.stop_continuation = logprobs, stop_continuation
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        eos = self.tok.eos_token_id
        if len(self.calls) == 1:
            ids = self.tok.encode(self.first, add_special_tokens=False) + [eos]
            lp = -0.5
        else:
            ids = self.tok.encode(self.continuation, add_special_tokens=False)
            ids = ids + [eos] if self.stop_continuation else ids
            lp = -0.25
            limit = sampling_params.get("max_tokens")
            ids = ids[:limit] if limit is not None else ids
        return TokenOutput(token_ids=ids, log_probs=[lp] * len(ids) if self.logprobs else None,
                           extra_fields={"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3})


def make_config(reward_path, response_length=256, prompt_length=64, **gec_overrides):
    gec_node = {"enable": True, **gec_overrides}
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": True,
                    "val_kwargs": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "n": 1},
                }
            },
            "data": {},
            "algorithm": {"adv_estimator": "grpo", "gec": gec_node},
            "reward": {
                "custom_reward_function": {"path": reward_path, "name": "compute_score", "reward_kwargs": {}},
                "reward_manager": {"source": "register", "name": "naive"},
                "reward_model": {"enable": False},
            },
        }
    )


def sample(solution=SOLUTION, uid="u0", content="What is 2+3?"):
    extra = {"index": 0}
    if solution is not None:
        extra["solution"] = solution
    return {
        "raw_prompt": [{"role": "user", "content": content}],
        "reward_model": {"ground_truth": "5", "style": "rule"},
        "extra_info": extra,
        "data_source": "toy",
        "uid": uid,
        "index": 0,
    }


TRAIN_SP = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
VAL_SP = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def run_loop(tok, config, server, sampling_params=TRAIN_SP, agent_cls=None, **kwargs):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.rollout.gec_agent_loop import GecAgentLoop

    cls = agent_cls or GecAgentLoop
    kw = sample() if not kwargs else kwargs

    async def main():  # verl's AgentLoopBase binds the running event loop at construction
        loop = cls(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tok, processor=None,
                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))
        return await loop.run(dict(sampling_params), **kw)

    return asyncio.run(main())


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def prompt_of(tok, content="What is 2+3?"):
    text = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                   tokenize=False)
    return tok.encode(text, add_special_tokens=False)


# ---------------------------------------------------------------- pure logic


def test_split_terminal_and_budget():
    assert gec.split_terminal([5, 6, 9, 8, 8], {8, 9}) == ([5, 6], 9)
    assert gec.split_terminal([5, 6], {8, 9}) == ([5, 6], None)
    assert gec.split_terminal([], {8}) == ([], None)
    assert gec.continuation_budget(10, 4, 256) == 6
    assert gec.continuation_budget(10, 12, 256) == 0
    assert gec.continuation_budget(1000, 4, 256) == 256


def test_assemble_response_masks_logprobs_truncation():
    segs = [gec.Segment([1, 2, 3], injected=False, mask=[1, 1, 1], logprobs=[-1.0, -2.0, -3.0]),
            gec.Segment([7, 7], injected=True),
            gec.Segment([4, 5], injected=False, logprobs=[-4.0])]
    out = gec.assemble_response(segs, response_length=10, mask_injected=False, with_logprobs=True)
    assert out.response_ids == [1, 2, 3, 7, 7, 4, 5]
    assert out.response_mask == [1] * 7
    assert out.response_logprobs == [-1.0, -2.0, -3.0, 0.0, 0.0, -4.0, 0.0]
    assert not out.truncated and out.injected_tokens == 2 and out.policy_prefix_tokens == 3
    out = gec.assemble_response(segs, response_length=4, mask_injected=True, with_logprobs=False)
    assert out.response_ids == [1, 2, 3, 7] and out.response_mask == [1, 1, 1, 0]
    assert out.response_logprobs is None and out.truncated and out.injected_tokens == 1
    assert out.segment_lengths == [3, 1, 0]


def test_branch_probabilities_seeded():
    cfg = GecConfig(enable=True)
    rng = random.Random(1234)
    n = 40000
    counts = Counter(gec.draw_branch(cfg, rng) for _ in range(n))
    assert abs(counts["reflect"] / n - 0.5) < 0.01
    assert abs(counts["answer"] / n - 0.25) < 0.01
    assert abs(counts["solution"] / n - 0.25) < 0.01
    cfg2 = GecConfig(enable=True, p_reflect=0.2, p_answer=0.0, p_solution=0.8)
    counts = Counter(gec.draw_branch(cfg2, rng) for _ in range(n))
    assert counts["answer"] == 0 and abs(counts["solution"] / n - 0.8) < 0.01
    # per-sample seeding: deterministic per key, different across keys
    draws_a = [gec.draw_branch(cfg, gec.sample_rng(0, "uid", i)) for i in range(200)]
    draws_b = [gec.draw_branch(cfg, gec.sample_rng(0, "uid", i)) for i in range(200)]
    assert draws_a == draws_b and len(set(draws_a)) == 3
    assert draws_a != [gec.draw_branch(cfg, gec.sample_rng(1, "uid", i)) for i in range(200)]
    # force_reflect never draws ground-truth branches
    fr = GecConfig(enable=True, mode="force_reflect")
    assert {gec.draw_branch(fr, rng) for _ in range(100)} == {"reflect"}


def test_choose_branch_gate_and_fallback():
    cfg = GecConfig(enable=True, p_reflect=0.0, p_answer=0.0, p_solution=1.0, prompt_length_gate=10)
    rng = random.Random(0)
    assert gec.choose_branch(cfg, score_before=1.0, prompt_len=50, has_solution=True, rng=rng) == "none"
    assert gec.choose_branch(cfg, score_before=0.0, prompt_len=10, has_solution=True, rng=rng) == "gated"
    assert gec.choose_branch(cfg, score_before=0.0, prompt_len=9, has_solution=True, rng=rng) == "solution"
    assert gec.choose_branch(cfg, score_before=0.0, prompt_len=9, has_solution=False, rng=rng) == "solution_fallback"
    never = GecConfig(enable=True, prompt_length_gate=None)
    assert gec.choose_branch(never, score_before=0.0, prompt_len=10**6, has_solution=True, rng=rng) != "gated"
    assert gec.reference_solution({"solution": "  "}, "solution") is None
    assert gec.reference_solution({}, "solution") is None
    assert gec.ground_truth_text({"ground_truth": ["7", "8"]}) == "7"


def test_validate_from_sampling_params():
    train, val = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}, {"temperature": 0.0, "top_p": 1.0, "top_k": -1}
    assert gec.validate_from_sampling_params(TRAIN_SP, train, val) is False
    assert gec.validate_from_sampling_params(VAL_SP, train, val) is True
    assert gec.validate_from_sampling_params(TRAIN_SP, train, train) is None


# ---------------------------------------------------------------- agent loop


def test_registered(verl_loop):
    module, registry = verl_loop
    assert registry["gec_agent"] == {"_target_": "verl_ext.rollout.gec_agent_loop.GecAgentLoop"}
    assert module.AGENT_NAME == "gec_agent"


def test_disabled_equals_single_turn(tok, reward_path, verl_loop):
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    config = make_config(reward_path, enable=False)
    a = run_loop(tok, config, FakeServer(tok))
    server = FakeServer(tok)
    b = run_loop(tok, config, server, agent_cls=SingleTurnAgentLoop)
    assert len(server.calls) == 1
    da, db = a.model_dump(), b.model_dump()
    da["metrics"].pop("generate_sequences"), db["metrics"].pop("generate_sequences")
    assert da == db
    assert not any(k.startswith("gec_") for k in a.extra_fields)


def test_correct_response_untouched(tok, reward_path, verl_loop):
    server = FakeServer(tok, first=FIRST_RIGHT)
    out = run_loop(tok, make_config(reward_path), server)
    assert out.response_ids == ids(tok, FIRST_RIGHT) + [tok.eos_token_id]
    assert out.extra_fields["gec_branch"] == "none" and out.extra_fields["gec_score_before"] == 1.0
    assert out.extra_fields["gec_correct_before"] is True
    assert out.reward_score is None and len(server.calls) == 1


def test_reflect_branch_token_exact(tok, reward_path, verl_loop):
    cfg = GecConfig()
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, p_reflect=1.0, p_answer=0.0, p_solution=0.0), server)
    eos = tok.eos_token_id
    core, cue, cont = ids(tok, FIRST_WRONG), ids(tok, cfg.cue), ids(tok, CONTINUATION) + [eos]
    assert out.prompt_ids == prompt_of(tok)  # original prompt, no hint
    assert out.response_ids == core + cue + cont  # first EOS dropped, continuation's EOS kept
    assert server.calls[1]["prompt_ids"] == prompt_of(tok) + core + cue
    assert server.calls[1]["sampling_params"]["max_tokens"] == min(256, 256 - len(core) - len(cue))
    assert server.calls[1]["sampling_params"]["temperature"] == 1.0
    assert out.response_mask == [1] * len(out.response_ids)
    assert out.response_logprobs == [-0.5] * len(core) + [0.0] * len(cue) + [-0.25] * len(cont)
    f = out.extra_fields
    assert f["gec_branch"] == "reflect" and f["gec_score_before"] == 0.0 and f["gec_correct_before"] is False
    assert f["gec_continuation_tokens"] == len(cont) and f["gec_injected_tokens"] == len(cue)
    assert f["gec_truncated"] is False and f["gec_response_len_before"] == len(core) + 1
    assert out.reward_score is None  # verl's reward loop scores the final response
    assert tok.decode(out.response_ids, skip_special_tokens=True) == FIRST_WRONG + cfg.cue + CONTINUATION


def test_answer_branch(tok, reward_path, verl_loop):
    cfg = GecConfig()
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0), server)
    template = cfg.answer_template.replace("{answer}", "5")
    assert out.prompt_ids == prompt_of(tok)
    assert out.response_ids == ids(tok, FIRST_WRONG) + ids(tok, template) + [tok.eos_token_id]
    assert len(server.calls) == 1
    assert out.extra_fields["gec_branch"] == "answer"
    assert len(out.response_logprobs) == len(out.response_ids)
    assert "\\boxed{5}." in tok.decode(out.response_ids)


def test_solution_branch_and_fallback(tok, reward_path, verl_loop):
    config = make_config(reward_path, p_reflect=0.0, p_answer=0.0, p_solution=1.0)
    out = run_loop(tok, config, FakeServer(tok))
    assert out.response_ids == ids(tok, SOLUTION) + [tok.eos_token_id]
    assert out.response_logprobs == [0.0] * len(out.response_ids)
    assert out.extra_fields["gec_branch"] == "solution"
    assert out.extra_fields["gec_injected_tokens"] == len(out.response_ids)
    out = run_loop(tok, config, FakeServer(tok), **sample(solution=None))
    template = GecConfig().answer_template.replace("{answer}", "5")
    assert out.extra_fields["gec_branch"] == "solution_fallback"
    assert out.response_ids == ids(tok, FIRST_WRONG) + ids(tok, template) + [tok.eos_token_id]


def test_prompt_length_gate(tok, reward_path, verl_loop):
    n_prompt = len(prompt_of(tok))
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, prompt_length_gate=n_prompt), server)
    assert out.extra_fields["gec_branch"] == "gated" and len(server.calls) == 1
    assert out.response_ids == ids(tok, FIRST_WRONG) + [tok.eos_token_id]
    out = run_loop(tok, make_config(reward_path, prompt_length_gate=n_prompt + 1, p_reflect=1.0, p_answer=0.0,
                                    p_solution=0.0), FakeServer(tok))
    assert out.extra_fields["gec_branch"] == "reflect"


def test_truncation(tok, reward_path, verl_loop):
    cfg = GecConfig()
    core, cue = ids(tok, FIRST_WRONG), ids(tok, cfg.cue)
    # reflect: room for 5 continuation tokens only -> max_tokens=5, counted as truncated
    rl = len(core) + len(cue) + 5
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, response_length=rl, p_reflect=1.0, p_answer=0.0, p_solution=0.0),
                   server)
    assert server.calls[1]["sampling_params"]["max_tokens"] == 5
    assert len(out.response_ids) == rl == len(out.response_mask) == len(out.response_logprobs)
    assert out.response_ids == core + cue + ids(tok, CONTINUATION)[:5]
    assert out.extra_fields["gec_truncated"] is True and out.extra_fields["gec_continuation_tokens"] == 5
    # no room at all after the cue: no continuation request
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, response_length=len(core) + 3, p_reflect=1.0, p_answer=0.0,
                                    p_solution=0.0), server)
    assert len(server.calls) == 1
    assert out.response_ids == (core + cue)[: len(core) + 3] and out.extra_fields["gec_truncated"] is True
    # solution longer than the response budget
    out = run_loop(tok, make_config(reward_path, response_length=len(core) + 1, p_reflect=0.0, p_answer=0.0,
                                    p_solution=1.0), FakeServer(tok), **sample(solution=SOLUTION * 3))
    assert out.response_ids == ids(tok, SOLUTION * 3)[: len(core) + 1] and out.extra_fields["gec_truncated"] is True
    # reflect that fits: not truncated even though max_continuation_tokens caps it
    out = run_loop(tok, make_config(reward_path, max_continuation_tokens=3, p_reflect=1.0, p_answer=0.0,
                                    p_solution=0.0), FakeServer(tok))
    assert out.extra_fields["gec_continuation_tokens"] == 3 and out.extra_fields["gec_truncated"] is False


def test_mask_injected(tok, reward_path, verl_loop):
    cfg = GecConfig()
    out = run_loop(tok, make_config(reward_path, mask_injected=True, p_reflect=1.0, p_answer=0.0, p_solution=0.0),
                   FakeServer(tok))
    core, cue, cont = ids(tok, FIRST_WRONG), ids(tok, cfg.cue), ids(tok, CONTINUATION) + [tok.eos_token_id]
    assert out.response_mask == [1] * len(core) + [0] * len(cue) + [1] * len(cont)
    out = run_loop(tok, make_config(reward_path, mask_injected=True, p_reflect=0.0, p_answer=1.0, p_solution=0.0),
                   FakeServer(tok))
    n_core = len(core)
    assert out.response_mask[:n_core] == [1] * n_core and set(out.response_mask[n_core:]) == {0}


def test_force_reflect_mode(tok, reward_path, verl_loop):
    cfg = GecConfig()
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, mode="force_reflect", p_reflect=0.0, p_answer=1.0, p_solution=0.0),
                   server)
    assert out.extra_fields["gec_branch"] == "reflect" and len(server.calls) == 2
    assert out.response_ids == ids(tok, FIRST_WRONG) + ids(tok, cfg.cue) + ids(tok, CONTINUATION) + [tok.eos_token_id]
    assert "correct answer" not in tok.decode(out.response_ids)


def test_no_rollout_logprobs(tok, reward_path, verl_loop):
    out = run_loop(tok, make_config(reward_path, p_reflect=1.0, p_answer=0.0, p_solution=0.0),
                   FakeServer(tok, logprobs=False))
    assert out.response_logprobs is None and out.extra_fields["gec_branch"] == "reflect"


def test_validation_untouched_through_verl_worker(tok, reward_path, verl_loop):
    """verl's own AgentLoopWorker._run_agent_loop: validate=True -> untouched; train -> corrected."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0)

    async def post(output, validate, **kwargs):
        return output

    def worker(server):
        return types.SimpleNamespace(config=config, llm_client=server, tokenizer=tok, processor=None,
                                     hf_model_type=None, dataset_cls=RLHFDataset, tools=[],
                                     _agent_loop_postprocess=post)

    async def go(validate, sp):
        server = FakeServer(tok)
        trajectory = {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": validate}
        out = await AgentLoopWorker._run_agent_loop(worker(server), dict(sp), trajectory, agent_name="gec_agent",
                                                    trace=False, **sample())
        return out, server

    # identical sampling params on purpose: detection must come from the worker, not from temperatures
    val, server = asyncio.run(go(True, TRAIN_SP))
    assert val.response_ids == ids(tok, FIRST_WRONG) + [tok.eos_token_id] and len(server.calls) == 1
    assert not any(k.startswith("gec_") for k in val.extra_fields)
    train, _ = asyncio.run(go(False, VAL_SP))
    assert train.extra_fields["gec_branch"] == "answer"


def test_validation_fallback_on_sampling_params(tok, reward_path, verl_loop):
    # called outside a verl worker: val_kwargs temperature (0.0) differs from training (1.0)
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0), server,
                   sampling_params=VAL_SP)
    assert "gec_branch" not in out.extra_fields and len(server.calls) == 1


# ---------------------------------------------------------------- step metrics


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


def test_gec_step_metrics_without_gec_rows():
    assert gec_step_metrics({"uid": np.array(["a"])}, ["a"], [1.0]) == {}
    ntb = {"gec_branch": np.array([None, None], dtype=object)}
    assert gec_step_metrics(ntb, ["a", "a"], [1.0, 0.0]) == {}


def test_fields_reach_trainer_batch_legacy_and_v1(tok, reward_path, verl_loop):
    """verl's own postprocessing: legacy AgentLoopWorker._postprocess columns, v1 AgentLoopOutput.as_dict."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    config = make_config(reward_path, response_length=96, p_reflect=1.0, p_answer=0.0, p_solution=0.0)
    reflect = run_loop(tok, config, FakeServer(tok))
    kept = run_loop(tok, config, FakeServer(tok, first=FIRST_RIGHT))

    # v1 (TransferQueue): one dict per sample, GEC fields inside its "extra_fields"
    field = reflect.as_dict()
    assert field["responses"].shape == field["response_mask"].shape == field["rollout_log_probs"].shape
    assert field["extra_fields"]["gec_branch"] == "reflect"
    td = list_of_dict_to_tensordict([field, kept.as_dict()])
    assert len(td) == 2

    # legacy: padded per-sample outputs -> DataProto with one non-tensor column per extra field
    fake = types.SimpleNamespace(rollout_config=config.actor_rollout_ref.rollout, tokenizer=tok, processor=None,
                                 mm_processor_kwargs={}, reward_loop_worker_handles=None,
                                 distillation_enabled=False)
    for name in ("_pad_token_ids", "_compute_multi_modal_inputs", "_compute_position_ids", "_compute_score",
                 "_compute_teacher_logprobs", "_get_mm_processor_kwargs", "_agent_loop_postprocess", "_postprocess"):
        setattr(fake, name, types.MethodType(getattr(AgentLoopWorker, name), fake))

    async def go():
        outs = [await fake._agent_loop_postprocess(o, False, **sample()) for o in (reflect, kept)]
        return fake._postprocess(outs)

    data = asyncio.run(go())
    assert list(data.non_tensor_batch["gec_branch"]) == ["reflect", "none"]
    assert list(data.non_tensor_batch["gec_score_before"]) == [0.0, 1.0]
    n = len(reflect.response_ids)
    assert data.batch["responses"][0, :n].tolist() == reflect.response_ids
    assert data.batch["response_mask"][0].sum().item() == n
    assert data.batch["rollout_log_probs"].shape == data.batch["responses"].shape
    m = gec_step_metrics(data.non_tensor_batch, ["g", "g"], [1.0, 1.0])
    assert m["gec/acc_before"] == 0.5 and m["gec/count/reflect"] == 1 and m["gec/groups_rescued"] == 0

"""Guided Error Correction / +Force-R (verl_ext.rollout): pure logic and the gec_agent loop with a fake server.

The agent loop runs verl's real SingleTurnAgentLoop code, verl's real reward manager (a custom reward function
file written here) and, for telling training from validation rows, verl's real AgentLoopWorker.generate_sequences.
"""

from __future__ import annotations

import asyncio
import random
import time
import types
from collections import Counter

import numpy as np
import pytest
from omegaconf import OmegaConf

from verl_ext.config import GecConfig
from verl_ext.names import TRAINING_ROLLOUT_KEY
from verl_ext.rollout import gec
from verl_ext.trainer.gec_metrics import gec_step_metrics

REWARD_FN = '''
import re
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    boxes = re.findall(r"\\\\boxed\\{([^{}]*)\\}", solution_str)
    return 1.0 if boxes and boxes[-1].strip() == str(ground_truth).strip() else 0.0

def one_plus_acc_dict(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    # EDGE-GRPO's scale (format reward always 1, plus accuracy), returned with its accuracy
    acc = compute_score(data_source, solution_str, ground_truth)
    return {"score": 1.0 + acc, "acc": acc, "format": 1.0}

def one_plus_acc_float(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return 1.0 + compute_score(data_source, solution_str, ground_truth)

def reward_model_score(data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None,
                       **kwargs):
    # a reward function that asks verl's reward model (verl's genrm pattern): scores only with its router
    return 0.0 if reward_router_address is None else 1.0
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

    def __init__(self, tok, first=FIRST_WRONG, continuation=CONTINUATION, logprobs=True, stop_continuation=True,
                 first_ignores_max_tokens=False, routed_experts=False):
        self.tok, self.first, self.continuation = tok, first, continuation
        self.logprobs, self.stop_continuation = logprobs, stop_continuation
        self.first_ignores_max_tokens = first_ignores_max_tokens  # a backend that over-generates
        self.routed_experts = routed_experts  # router replay: (prompt + generated, layers=2, topk=2), call number
        self.calls = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params),
                           "request_id": request_id})
        eos = self.tok.eos_token_id
        if len(self.calls) == 1:
            ids = self.tok.encode(self.first, add_special_tokens=False) + [eos]
            lp = -0.5
        else:
            ids = self.tok.encode(self.continuation, add_special_tokens=False)
            ids = ids + [eos] if self.stop_continuation else ids
            lp = -0.25
        limit = sampling_params.get("max_tokens")  # as vLLM / SGLang / the hf backend: at most max_tokens
        if limit is not None and not (len(self.calls) == 1 and self.first_ignores_max_tokens):
            ids = ids[:limit]
        routing = None
        if self.routed_experts:
            routing = np.full((len(prompt_ids) + len(ids), 2, 2), len(self.calls), dtype=np.int32)
        return TokenOutput(token_ids=ids, log_probs=[lp] * len(ids) if self.logprobs else None,
                           routed_experts=routing,
                           extra_fields={"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3})


def make_config(reward_path, response_length=512, prompt_length=64, reward_name="compute_score", **gec_overrides):
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
                "custom_reward_function": {"path": reward_path, "name": reward_name, "reward_kwargs": {}},
                "reward_manager": {"source": "register", "name": "naive"},
                "reward_model": {"enable": False},
            },
        }
    )


def sample(solution=SOLUTION, uid="u0", content="What is 2+3?", training=True):
    """One dataset row as the agent loop receives it, tagged by verl_ext's trainer (training or validation)."""
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
        TRAINING_ROLLOUT_KEY: training,
    }


TRAIN_SP = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
VAL_SP = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def run_loop(tok, config, server, sampling_params=TRAIN_SP, agent_cls=None, **kwargs):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.rollout.gec_agent_loop import GecAgentLoop

    cls = agent_cls or GecAgentLoop
    kw = kwargs if kwargs else sample()

    async def main():  # verl's AgentLoopBase binds the running event loop at construction
        loop = cls(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tok, processor=None,
                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))
        return await loop.run(dict(sampling_params), **kw)

    return asyncio.run(main())


def verl_postprocess(tok, config, outputs, reward_handles=None):
    """verl's own ``AgentLoopWorker`` post-processing (scoring included) of agent-loop outputs -> DataProto."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    fake = types.SimpleNamespace(rollout_config=config.actor_rollout_ref.rollout, tokenizer=tok, processor=None,
                                 mm_processor_kwargs={}, reward_loop_worker_handles=reward_handles,
                                 distillation_enabled=False)
    for name in ("_pad_token_ids", "_compute_multi_modal_inputs", "_compute_position_ids", "_compute_score",
                 "_compute_teacher_logprobs", "_get_mm_processor_kwargs", "_agent_loop_postprocess", "_postprocess"):
        setattr(fake, name, types.MethodType(getattr(AgentLoopWorker, name), fake))

    async def go():
        outs = [await fake._agent_loop_postprocess(o, False, **sample()) for o in outputs]
        return fake._postprocess(outs)

    return asyncio.run(go())


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
    assert gec.choose_branch(cfg, correct=True, prompt_len=50, has_solution=True, rng=rng) == "none"
    assert gec.choose_branch(cfg, correct=False, prompt_len=10, has_solution=True, rng=rng) == "gated"
    assert gec.choose_branch(cfg, correct=False, prompt_len=9, has_solution=True, rng=rng) == "solution"
    assert gec.choose_branch(cfg, correct=False, prompt_len=9, has_solution=False, rng=rng) == "solution_fallback"
    assert gec.choose_branch(cfg, correct=False, prompt_len=9, has_solution=True, solution_fits=False,
                             rng=rng) == "solution_too_long"
    never = GecConfig(enable=True, prompt_length_gate=None)
    assert gec.choose_branch(never, correct=False, prompt_len=10**6, has_solution=True, rng=rng) != "gated"
    assert gec.reference_solution({"solution": "  "}, "solution") is None
    assert gec.reference_solution({}, "solution") is None
    assert gec.ground_truth_text({"ground_truth": ["7", "8"]}) == "7"
    assert gec.ground_truth_text({"ground_truth": 0}) == "0"


@pytest.mark.parametrize("gt", ["", "  ", [], [""], None, np.array([], dtype=object)])
def test_an_empty_ground_truth_is_no_answer_to_inject(gt):
    with pytest.raises(ValueError, match="needs reward_model.ground_truth"):
        gec.ground_truth_text({"ground_truth": gt})


def test_is_training_rollout():
    assert gec.is_training_rollout({TRAINING_ROLLOUT_KEY: True})
    assert gec.is_training_rollout({TRAINING_ROLLOUT_KEY: np.bool_(True)})
    assert not gec.is_training_rollout({TRAINING_ROLLOUT_KEY: False})
    assert not gec.is_training_rollout({})  # untagged: never corrected
    assert not gec.is_training_rollout({TRAINING_ROLLOUT_KEY: "yes"})


# ---------------------------------------------------------------- agent loop


def test_registered(verl_loop):
    module, registry = verl_loop
    assert registry["gec_agent"] == {"_target_": "verl_ext.rollout.gec_agent_loop.GecAgentLoop"}
    assert module.GecAgentLoop.__name__ == "GecAgentLoop"


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
    assert len(server.calls) == 1
    # its first score is final: set here, so verl's reward loop does not score it a second time
    assert out.reward_score == 1.0 and out.extra_fields["reward_extra_info"] == {"acc": 1.0}


def _verl_reward_loop_score(tok, config, monkeypatch, response_text, router=None) -> dict:
    """verl's final scorer: its ``RewardLoopWorker`` (as ``RewardLoopManager`` starts it, with the reward model's
    router when one is on) on a response of the default sample."""
    from verl.experimental.reward_loop import reward_loop

    from verl_ext.rollout.gec_agent_loop import build_reward_input

    config.actor_rollout_ref.model = {"path": "policy", "tokenizer_path": None}
    monkeypatch.setattr(reward_loop, "copy_to_local", lambda path, **kwargs: path)  # no files: the toy tokenizer
    monkeypatch.setattr(reward_loop, "hf_tokenizer", lambda path, **kwargs: tok)
    response = ids(tok, response_text) + [tok.eos_token_id]

    async def score():
        worker = reward_loop.RewardLoopWorker(config, reward_router_address=router)
        return await worker.compute_score(build_reward_input(prompt_of(tok), response, sample(), {}, 1))

    return asyncio.run(score())


@pytest.mark.parametrize("first", [FIRST_RIGHT, FIRST_WRONG])
def test_gecs_first_score_is_verls_reward_loop_score(tok, reward_path, verl_loop, monkeypatch, first):
    config = make_config(reward_path, reward_name="one_plus_acc_dict", p_reflect=0.0, p_answer=1.0, p_solution=0.0)
    verl = _verl_reward_loop_score(tok, config, monkeypatch, first)
    out = run_loop(tok, config, FakeServer(tok, first=first))
    assert out.extra_fields["gec_score_before"] == verl["reward_score"] == (2.0 if first == FIRST_RIGHT else 1.0)
    if first == FIRST_RIGHT:  # unedited: the loop hands verl that score and its extra info
        assert out.reward_score == verl["reward_score"]
        assert out.extra_fields["reward_extra_info"] == verl["reward_extra_info"]


def test_with_a_reward_model_gec_is_refused_not_scored_otherwise_than_verl(tok, reward_path, verl_loop, monkeypatch):
    """With a reward model on, verl's reward loop builds its reward manager with the reward model's router, which
    the agent loop cannot reach; GEC refuses rather than decide right/wrong (and ``prefix_advantage=before``'s r0)
    with another scorer than the one that gives the final reward."""
    from verl_ext.config import ConfigError

    config = make_config(reward_path, reward_name="reward_model_score")
    config.reward.reward_model.enable = True
    config.reward.reward_model.model_path = "reward-model"
    verl = _verl_reward_loop_score(tok, config, monkeypatch, FIRST_RIGHT, router="127.0.0.1:8000")
    assert verl["reward_score"] == 1.0
    try:
        out = run_loop(tok, config, FakeServer(tok, first=FIRST_RIGHT))
    except ConfigError as refused:
        assert "reward.reward_model.enable=true" in str(refused)
    else:
        pytest.fail(f"GEC scored the first response {out.extra_fields['gec_score_before']} with a reward manager "
                    "built without the reward router; verl's reward loop scores it 1.0")


def test_verl_scores_only_the_edited_responses_and_every_row_gets_the_same_reward_columns(tok, reward_path,
                                                                                          verl_loop):
    """verl's own AgentLoopWorker._compute_score and _postprocess with a reward-loop handle (no reward model)."""

    from verl_ext.rollout.gec_agent_loop import reward_manager_of

    config = make_config(reward_path, reward_name="one_plus_acc_dict", p_reflect=0.0, p_answer=1.0, p_solution=0.0)
    kept = run_loop(tok, config, FakeServer(tok, first=FIRST_RIGHT))
    edited = run_loop(tok, config, FakeServer(tok))
    assert kept.extra_fields["gec_branch"] == "none", kept.extra_fields
    assert kept.reward_score == 2.0 and edited.reward_score is None
    scored = []

    async def compute_score(data):  # what RewardLoopWorker.compute_score does without a reward model
        scored.append(tok.decode(data.batch["responses"][0]))
        return await reward_manager_of(config, tok).run_single(data)

    handle = types.SimpleNamespace(compute_score=types.SimpleNamespace(remote=compute_score))
    data = verl_postprocess(tok, config, [kept, edited], reward_handles=[handle])
    assert len(scored) == 1 and "boxed{5}" in scored[0]  # only the edited response, once
    assert data.batch["rm_scores"].sum(-1).tolist() == [2.0, 2.0]  # the injected answer is right
    assert list(data.non_tensor_batch["acc"]) == [1.0, 1.0]  # the reward's extra info, from both paths


def test_reflect_branch_token_exact(tok, reward_path, verl_loop):
    cfg = GecConfig()
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, p_reflect=1.0, p_answer=0.0, p_solution=0.0), server)
    eos = tok.eos_token_id
    core, cue, cont = ids(tok, FIRST_WRONG), ids(tok, cfg.cue), ids(tok, CONTINUATION) + [eos]
    assert out.prompt_ids == prompt_of(tok)  # original prompt, no hint
    assert out.response_ids == core + cue + cont  # first EOS dropped, continuation's EOS kept
    assert server.calls[1]["prompt_ids"] == prompt_of(tok) + core + cue
    # first generation: room kept for cue + max_continuation_tokens; the continuation gets all of it
    assert server.calls[0]["sampling_params"]["max_tokens"] == 512 - len(cue) - 256
    assert server.calls[1]["sampling_params"]["max_tokens"] == 256
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


def test_first_generation_capped_reflect_keeps_full_continuation(tok, reward_path, verl_loop):
    """The original's 1024 + 256: a first response that hits its cap still gets the whole continuation."""
    cfg = GecConfig()
    cue = ids(tok, cfg.cue)
    long_wrong = "I keep going " * 20 + FIRST_WRONG  # longer than the cap
    rl, cont_max = len(cue) + 40 + 16, 16  # first generation: 40 tokens
    server = FakeServer(tok, first=long_wrong)
    out = run_loop(tok, make_config(reward_path, response_length=rl, max_continuation_tokens=cont_max, p_reflect=1.0,
                                    p_answer=0.0, p_solution=0.0), server)
    first = ids(tok, long_wrong)[:40]
    assert server.calls[0]["sampling_params"]["max_tokens"] == 40
    assert server.calls[1]["sampling_params"]["max_tokens"] == cont_max
    assert out.response_ids == first + cue + ids(tok, CONTINUATION)[:cont_max]
    f = out.extra_fields
    assert f["gec_first_hit_cap"] is True and f["gec_response_len_before"] == 40
    assert f["gec_continuation_tokens"] == cont_max and f["gec_truncated"] is False  # stopped by its own budget
    # a first response that stops by itself did not hit the cap
    out = run_loop(tok, make_config(reward_path, response_length=rl, max_continuation_tokens=cont_max, p_reflect=1.0,
                                    p_answer=0.0, p_solution=0.0), FakeServer(tok))
    assert out.extra_fields["gec_first_hit_cap"] is False


def test_first_generation_reserves_answer_template(tok, reward_path, verl_loop):
    """Answer injection after a capped response: the whole template and EOS, never a cut template."""
    template = ids(tok, GecConfig().answer_template.replace("{answer}", "5"))
    long_wrong = "I keep going " * 20 + FIRST_WRONG
    rl = len(template) + 1 + 30
    # both branches drawable, the template (+ EOS) needs more room than cue + max_continuation_tokens: it decides
    server = FakeServer(tok, first=long_wrong)
    run_loop(tok, make_config(reward_path, response_length=rl, max_continuation_tokens=4), server)
    assert server.calls[0]["sampling_params"]["max_tokens"] == 30
    out = run_loop(tok, make_config(reward_path, response_length=rl, p_reflect=0.0, p_answer=1.0, p_solution=0.0),
                   FakeServer(tok, first=long_wrong))
    assert out.extra_fields["gec_branch"] == "answer"
    assert out.response_ids == ids(tok, long_wrong)[:30] + template + [tok.eos_token_id]
    assert len(out.response_ids) == rl
    assert "\\boxed{5}." in tok.decode(out.response_ids) and out.extra_fields["gec_truncated"] is False


def test_answer_without_room_is_skipped_and_counted(tok, reward_path, verl_loop):
    template = ids(tok, GecConfig().answer_template.replace("{answer}", "5"))
    core = ids(tok, FIRST_WRONG)
    # a backend that ignores max_tokens fills the room; the template must not be cut: no edit, branch counted
    rl = len(core) + len(template)  # one short of core + template + EOS
    server = FakeServer(tok, first_ignores_max_tokens=True)
    out = run_loop(tok, make_config(reward_path, response_length=rl, p_reflect=0.0, p_answer=1.0, p_solution=0.0),
                   server)
    assert server.calls[0]["sampling_params"]["max_tokens"] == rl - len(template) - 1
    assert out.extra_fields["gec_branch"] == "answer_no_room" and len(server.calls) == 1
    assert out.response_ids == core + [tok.eos_token_id]  # untouched
    assert out.extra_fields["gec_injected_tokens"] == 0 and out.extra_fields["gec_truncated"] is False
    # template longer than the whole response budget: the cap bottoms out at 1 token, still no cut template
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, response_length=len(template), p_reflect=0.0, p_answer=1.0,
                                    p_solution=0.0), server)
    assert server.calls[0]["sampling_params"]["max_tokens"] == 1
    assert out.extra_fields["gec_branch"] == "answer_no_room" and out.response_ids == core[:1]
    m = gec_step_metrics({"extra_fields": np.array([out.extra_fields], dtype=object)}, ["g"], [0.0])
    assert m["gec/count/answer_no_room"] == 1 and m["gec/frac_edited"] == 0


def test_solution_longer_than_budget_falls_back_to_answer(tok, reward_path, verl_loop):
    template = ids(tok, GecConfig().answer_template.replace("{answer}", "5"))
    long_solution = "Step. " * 40 + SOLUTION
    rl = len(template) + 1 + 40
    assert len(ids(tok, long_solution)) + 1 > rl
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, response_length=rl, p_reflect=0.0, p_answer=0.0, p_solution=1.0),
                   server, **sample(solution=long_solution))
    # the answer is the only possible edit for this row: its room is reserved
    assert server.calls[0]["sampling_params"]["max_tokens"] == 40
    assert out.extra_fields["gec_branch"] == "solution_too_long"
    assert out.response_ids == ids(tok, FIRST_WRONG) + template + [tok.eos_token_id]
    assert "\\boxed{5}" in tok.decode(out.response_ids) and out.extra_fields["gec_truncated"] is False
    # a solution that fits replaces the response, and nothing is reserved for this row
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, response_length=rl, p_reflect=0.0, p_answer=0.0, p_solution=1.0),
                   server)
    assert server.calls[0]["sampling_params"]["max_tokens"] == rl
    assert out.extra_fields["gec_branch"] == "solution"
    assert out.response_ids == ids(tok, SOLUTION) + [tok.eos_token_id]


def test_no_cap_without_gec_or_in_validation(tok, reward_path, verl_loop):
    server = FakeServer(tok)
    run_loop(tok, make_config(reward_path, enable=False), server)
    assert "max_tokens" not in server.calls[0]["sampling_params"]
    server = FakeServer(tok)
    run_loop(tok, make_config(reward_path), server, sampling_params=VAL_SP, **sample(training=False))
    assert "max_tokens" not in server.calls[0]["sampling_params"]
    # a caller's own smaller max_tokens is kept
    server = FakeServer(tok)
    run_loop(tok, make_config(reward_path, p_reflect=1.0, p_answer=0.0, p_solution=0.0), server,
             sampling_params={**TRAIN_SP, "max_tokens": 7})
    assert server.calls[0]["sampling_params"]["max_tokens"] == 7


def test_first_generation_budget():
    cfg = GecConfig(enable=True)  # reflect and answer drawable
    assert gec.first_generation_budget(cfg, 1287, cue_tokens=7, answer_tokens=25) == 1024
    assert gec.first_generation_budget(cfg, 1287, cue_tokens=7, answer_tokens=400) == 1287 - 401
    assert gec.first_generation_budget(cfg, 100, cue_tokens=7, answer_tokens=25) == 1  # never below one token
    fr = GecConfig(enable=True, mode="force_reflect", p_reflect=0.0, p_answer=1.0, p_solution=0.0)
    assert gec.first_generation_budget(fr, 1287, cue_tokens=7, answer_tokens=400) == 1024  # no answer branch
    answer_only = GecConfig(enable=True, p_reflect=0.0, p_answer=1.0, p_solution=0.0)
    assert gec.first_generation_budget(answer_only, 1287, cue_tokens=7, answer_tokens=25) == 1261
    assert gec.first_generation_budget(answer_only, 1287, cue_tokens=7, answer_tokens=None) == 1287
    solution_only = GecConfig(enable=True, p_reflect=0.0, p_answer=0.0, p_solution=1.0)
    assert gec.first_generation_budget(solution_only, 1287, cue_tokens=7, answer_tokens=25) == 1287
    assert gec.first_generation_budget(solution_only, 1287, cue_tokens=7, answer_tokens=25,
                                       solution_fits=False) == 1261


def test_truncation_counted_when_a_backend_overruns(tok, reward_path, verl_loop):
    """Edits are still cut to response_length (and counted) if a first response exceeds its cap anyway."""
    cfg = GecConfig()
    core, cue = ids(tok, FIRST_WRONG), ids(tok, cfg.cue)
    reflect = dict(p_reflect=1.0, p_answer=0.0, p_solution=0.0)
    # reflect: room for 5 continuation tokens only -> max_tokens=5, counted as truncated
    rl = len(core) + len(cue) + 5
    server = FakeServer(tok, first_ignores_max_tokens=True)
    out = run_loop(tok, make_config(reward_path, response_length=rl, **reflect), server)
    assert server.calls[1]["sampling_params"]["max_tokens"] == 5
    assert len(out.response_ids) == rl == len(out.response_mask) == len(out.response_logprobs)
    assert out.response_ids == core + cue + ids(tok, CONTINUATION)[:5]
    assert out.extra_fields["gec_truncated"] is True and out.extra_fields["gec_continuation_tokens"] == 5
    # no room at all after the cue: no continuation request
    server = FakeServer(tok, first_ignores_max_tokens=True)
    out = run_loop(tok, make_config(reward_path, response_length=len(core) + 3, **reflect), server)
    assert len(server.calls) == 1
    assert out.response_ids == (core + cue)[: len(core) + 3] and out.extra_fields["gec_truncated"] is True
    # reflect that fits: not truncated even though max_continuation_tokens caps it
    out = run_loop(tok, make_config(reward_path, max_continuation_tokens=3, **reflect), FakeServer(tok))
    assert out.extra_fields["gec_continuation_tokens"] == 3 and out.extra_fields["gec_truncated"] is False


def test_correctness_from_the_rewards_acc(tok, reward_path, verl_loop):
    """1 + accuracy scale: every response scores >= 1, so only the reward's ``acc`` tells right from wrong."""
    answer = dict(p_reflect=0.0, p_answer=1.0, p_solution=0.0)
    out = run_loop(tok, make_config(reward_path, reward_name="one_plus_acc_dict", **answer), FakeServer(tok))
    f = out.extra_fields
    assert f["gec_score_before"] == 1.0 and f["gec_correct_before"] is False and f["gec_branch"] == "answer"
    out = run_loop(tok, make_config(reward_path, reward_name="one_plus_acc_dict", **answer),
                   FakeServer(tok, first=FIRST_RIGHT))
    assert out.extra_fields["gec_score_before"] == 2.0 and out.extra_fields["gec_branch"] == "none"
    # a plain float reward has no acc of its own: score >= correct_threshold decides
    out = run_loop(tok, make_config(reward_path, reward_name="one_plus_acc_float", **answer), FakeServer(tok))
    assert out.extra_fields["gec_branch"] == "none"  # 1.0 >= the default threshold 1.0
    out = run_loop(tok, make_config(reward_path, reward_name="one_plus_acc_float", correct_threshold=2.0, **answer),
                   FakeServer(tok))
    assert out.extra_fields["gec_correct_before"] is False and out.extra_fields["gec_branch"] == "answer"


def test_response_is_correct_rules():
    cfg = GecConfig(correct_threshold=1.0)
    assert gec.response_is_correct(cfg, 1.0, {"score": 1.0, "acc": 0.0}) is False
    assert gec.response_is_correct(cfg, 2.0, {"score": 2.0, "acc": True}) is True
    assert gec.response_is_correct(cfg, 0.0, {"score": 0.0, "acc": np.float32(1.0)}) is True
    assert gec.response_is_correct(cfg, 1.5, {"score": 1.5, "acc": 0.5}) is False  # partial credit is wrong
    # verl's reward managers put a float result's score into acc: no score key, the threshold decides
    assert gec.response_is_correct(cfg, 1.0, {"acc": 1.0}) is True
    assert gec.response_is_correct(cfg, 0.5, {}) is False
    assert gec.response_is_correct(cfg, 1.0, {"score": 1.0, "acc": "n/a"}) is True  # not a number: threshold


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
    """verl's own AgentLoopWorker.generate_sequences hands each row's columns to run(): a row tagged as validation
    is untouched, one tagged as training is corrected, with identical sampling params."""
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0)
    config.actor_rollout_ref.rollout.val_kwargs.temperature = 1.0  # same params for both: only the tag differs
    config.actor_rollout_ref.rollout.agent = {"default_agent_loop": "gec_agent"}

    async def post(output, validate, **kwargs):
        return output

    def worker(server):
        fake = types.SimpleNamespace(config=config, rollout_config=config.actor_rollout_ref.rollout,
                                     llm_client=server, tokenizer=tok, processor=None, hf_model_type=None,
                                     dataset_cls=RLHFDataset, tools=[], _agent_loop_postprocess=post,
                                     _postprocess=lambda outputs, **kw: outputs)
        fake._run_agent_loop = types.MethodType(AgentLoopWorker._run_agent_loop, fake)
        return fake

    def rows(training: bool, validate_meta: bool) -> DataProto:
        columns = {k: np.array([v], dtype=object) for k, v in sample(training=training).items()}
        return DataProto.from_single_dict(columns, meta_info={"validate": validate_meta, "global_steps": 1})

    async def go(training: bool, validate_meta: bool):
        server = FakeServer(tok)
        (out,) = await AgentLoopWorker.generate_sequences(worker(server), rows(training, validate_meta))
        return out, server

    val, server = asyncio.run(go(training=False, validate_meta=True))
    assert val.response_ids == ids(tok, FIRST_WRONG) + [tok.eos_token_id] and len(server.calls) == 1
    assert not any(k.startswith("gec_") for k in val.extra_fields)
    train, _ = asyncio.run(go(training=True, validate_meta=False))
    assert train.extra_fields["gec_branch"] == "answer"


def test_untagged_row_is_not_corrected_and_warned(tok, reward_path, verl_loop, caplog):
    """A row no verl_ext trainer tagged (e.g. verl's own entry point): GEC stays off for it, with a warning."""
    module, _ = verl_loop
    module._WARNED.discard("untagged")
    row = sample()
    row.pop(TRAINING_ROLLOUT_KEY)
    server = FakeServer(tok)
    with caplog.at_level("WARNING", logger=module.logger.name):
        out = run_loop(tok, make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0), server, **row)
    assert "gec_branch" not in out.extra_fields and len(server.calls) == 1
    assert TRAINING_ROLLOUT_KEY in caplog.text


def test_fields_reach_trainer_batch_legacy_and_v1(tok, reward_path, verl_loop):
    """verl's own postprocessing: legacy AgentLoopWorker._postprocess columns, v1 AgentLoopOutput.as_dict."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    config = make_config(reward_path, response_length=96, max_continuation_tokens=32, p_reflect=1.0, p_answer=0.0,
                         p_solution=0.0)
    reflect = run_loop(tok, config, FakeServer(tok))
    kept = run_loop(tok, config, FakeServer(tok, first=FIRST_RIGHT))

    # v1 (TransferQueue): one dict per sample, GEC fields inside its "extra_fields"
    field = reflect.as_dict()
    assert field["responses"].shape == field["response_mask"].shape == field["rollout_log_probs"].shape
    assert field["extra_fields"]["gec_branch"] == "reflect"
    td = list_of_dict_to_tensordict([field, kept.as_dict()])
    assert len(td) == 2

    # legacy: padded per-sample outputs -> DataProto with one non-tensor column per extra field
    data = verl_postprocess(tok, config, [reflect, kept])
    assert list(data.non_tensor_batch["gec_branch"]) == ["reflect", "none"]
    assert list(data.non_tensor_batch["gec_score_before"]) == [0.0, 1.0]
    n = len(reflect.response_ids)
    assert data.batch["responses"][0, :n].tolist() == reflect.response_ids
    assert data.batch["response_mask"][0].sum().item() == n
    assert data.batch["rollout_log_probs"].shape == data.batch["responses"].shape
    m = gec_step_metrics(data.non_tensor_batch, ["g", "g"], [1.0, 1.0])
    assert m["gec/acc_before"] == 0.5 and m["gec/count/reflect"] == 1 and m["gec/groups_rescued"] == 0


def test_row_sampling_params_override_per_row(tok, reward_path, verl_loop):
    """A row's extra_info.sampling_params replaces the trainer's for that row only (e.g. a greedy validation copy),
    with GEC off and in validation; unknown keys are an error."""
    from verl_ext.rollout.gec_agent_loop import row_sampling_params

    assert row_sampling_params(TRAIN_SP, {"index": 0}) is TRAIN_SP
    assert row_sampling_params(TRAIN_SP, {"sampling_params": None}) is TRAIN_SP
    assert row_sampling_params(TRAIN_SP, {"sampling_params": {"temperature": 0.0, "top_k": None}}) == {
        **TRAIN_SP, "temperature": 0.0}
    with pytest.raises(ValueError, match="temprature"):
        row_sampling_params(TRAIN_SP, {"sampling_params": {"temprature": 0.0}})
    for enable, training in ((False, True), (True, False)):  # GEC off; GEC on and a validation row
        server = FakeServer(tok)
        row = sample(training=training)
        row["extra_info"]["sampling_params"] = {"temperature": 0.0}
        run_loop(tok, make_config(reward_path, enable=enable), server, sampling_params=TRAIN_SP, **row)
        assert len(server.calls) == 1 and server.calls[0]["sampling_params"]["temperature"] == 0.0
        assert server.calls[0]["sampling_params"]["top_p"] == TRAIN_SP["top_p"]  # the rest stays the trainer's


# ---------------------------------------------------------------- the degenerate-edit guard (min_own_tokens)


def test_guard_rule_and_validation():
    from verl_ext.config import ConfigError

    off = GecConfig(enable=True)
    assert off.min_own_tokens == 0  # the paper's behaviour by default
    on = GecConfig(enable=True, min_own_tokens=2, p_reflect=0.0, p_answer=1.0, p_solution=0.0)
    rng = random.Random(0)
    kw = dict(prompt_len=5, has_solution=True, rng=rng)
    assert gec.choose_branch(off, correct=False, own_tokens=0, **kw) != "too_short"
    assert gec.choose_branch(on, correct=False, own_tokens=0, **kw) == "too_short"
    assert gec.choose_branch(on, correct=False, own_tokens=1, **kw) == "too_short"
    assert gec.choose_branch(on, correct=False, own_tokens=2, **kw) == "answer"  # k own tokens: corrected
    assert gec.choose_branch(on, correct=True, own_tokens=0, **kw) == "none"  # a right reply is never touched
    assert "too_short" in gec.BRANCHES and "too_short" not in gec.EDIT_BRANCHES
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="min_own_tokens"):
            GecConfig(enable=True, min_own_tokens=bad).validate()
    GecConfig(enable=True, min_own_tokens=3).validate()


@pytest.mark.parametrize("first,k,expect", [("", 1, "too_short"), ("", 0, "answer"), ("7", 2, "too_short"),
                                            ("7", 1, "answer"), ("78", 2, "answer")])
def test_guard_leaves_short_wrong_replies_uncorrected(tok, reward_path, verl_loop, first, k, expect):
    """An immediately-ended (or k-1 token) wrong reply stays as the policy wrote it: no continuation, no injected
    tokens, its own EOS, so the reward scores it wrong and GRPO penalises it. Longer ones are corrected as before."""
    server = FakeServer(tok, first=first)
    out = run_loop(tok, make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0, min_own_tokens=k),
                   server)
    assert out.extra_fields["gec_branch"] == expect
    if expect == "too_short":
        assert out.response_ids == ids(tok, first) + [tok.eos_token_id] and len(server.calls) == 1
        assert out.extra_fields["gec_injected_tokens"] == 0 and out.extra_fields["gec_correct_before"] is False
    else:
        assert out.extra_fields["gec_injected_tokens"] > 0


def _run_group(tok, config, firsts, uid):
    """One group's samples as verl's agent-loop worker runs them: concurrent tasks of one event loop."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.rollout.gec_agent_loop import GecAgentLoop

    async def main():
        loops = [GecAgentLoop(trainer_config=DictConfigWrap(config), server_manager=FakeServer(tok, first=first),
                              tokenizer=tok, processor=None, dataset_cls=RLHFDataset,
                              data_config=DictConfigWrap(config.data)) for first in firsts]
        return await asyncio.gather(*(loop.run(dict(TRAIN_SP), **sample(uid=uid)) for loop in loops))

    return asyncio.run(main())


def test_edit_scope_all_wrong_groups_edits_only_groups_without_a_right_first_attempt(tok, reward_path, verl_loop):
    config = make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0, edit_scope="all_wrong_groups")
    config.actor_rollout_ref.rollout.n = 3
    mixed = _run_group(tok, config, [FIRST_WRONG, FIRST_RIGHT, FIRST_WRONG], uid="mixed")
    assert [o.extra_fields["gec_branch"] for o in mixed] == ["group_not_all_wrong", "none", "group_not_all_wrong"]
    for out in mixed:  # untouched: the policy's own response, its own score (plain GRPO)
        assert out.extra_fields["gec_injected_tokens"] == 0 and out.reward_score is not None
    hard = _run_group(tok, config, [FIRST_WRONG] * 3, uid="hard")
    assert [o.extra_fields["gec_branch"] for o in hard] == ["answer"] * 3
    # the paper's scope edits the mixed group's wrong responses too
    paper = make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0)
    paper.actor_rollout_ref.rollout.n = 3
    assert [o.extra_fields["gec_branch"] for o in _run_group(tok, paper, [FIRST_WRONG, FIRST_RIGHT, FIRST_WRONG],
                                                              uid="mixed")] == ["answer", "none", "answer"]


class FailingServer(FakeServer):
    """A generation that raises (``error``) or never returns until cancelled (``error=None``)."""

    def __init__(self, tok, error=None):
        super().__init__(tok)
        self.error = error

    async def generate(self, request_id, **kwargs):
        if self.error is None:
            await asyncio.Event().wait()  # hangs until its task is cancelled
        raise self.error


@pytest.mark.parametrize("failure", ["raises", "cancelled"])
def test_a_failed_member_stops_its_wrong_siblings_once_the_group_is_in(tok, reward_path, verl_loop, failure):
    """edit_scope=all_wrong_groups: a sample whose run fails before it reports its first attempt (its generation
    raises, or its task is cancelled), its siblings all wrong: the wrong siblings already waiting, and one arriving
    after the failure, stop as soon as that last one reported, with an error naming the group and the failure, and
    no group entry is left."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.rollout.gec_agent_loop import _FIRST_ATTEMPTS, GecAgentLoop

    config = make_config(reward_path, edit_scope="all_wrong_groups")
    config.actor_rollout_ref.rollout.n = 4
    uid = f"failing-{failure}"
    engine_error = RuntimeError("the engine died")

    class SlowServer(FakeServer):  # a sibling whose first attempt is scored after the failure
        async def generate(self, request_id, **kwargs):
            await asyncio.sleep(0.3)
            return await super().generate(request_id, **kwargs)

    servers = [FakeServer(tok), FailingServer(tok, engine_error if failure == "raises" else None), FakeServer(tok),
               SlowServer(tok)]

    async def main():
        loops = [GecAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tok,
                              processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))
                 for server in servers]
        tasks = [asyncio.create_task(loop.run(dict(TRAIN_SP), **sample(uid=uid))) for loop in loops]
        if failure == "cancelled":
            await asyncio.sleep(0.1)  # the two fast siblings are waiting for the group by now
            tasks[1].cancel()
        start = time.perf_counter()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5.0)
        return results, time.perf_counter() - start

    results, elapsed = asyncio.run(main())
    assert elapsed < 2.0
    if failure == "raises":
        assert results[1] is engine_error
    else:
        assert isinstance(results[1], asyncio.CancelledError)
    for i in (0, 2, 3):  # the two waiting siblings and the one that arrived after the failure
        assert isinstance(results[i], RuntimeError), results[i]
        message = str(results[i])
        assert uid in message and "edit_scope=all_wrong_groups" in message
        assert ("the engine died" in message) if failure == "raises" else ("CancelledError" in message)
    assert not [key for key in _FIRST_ATTEMPTS._open if key[0] == uid]


def test_a_failed_member_lets_verls_v1_run_prompt_settle_its_group_at_once(tok, reward_path, verl_loop, monkeypatch):
    """v1: verl's own ``AgentLoopWorkerTQ._run_prompt`` waits for every session of a prompt (no cancellation, no
    timeout of its own) before it marks the group failed; with one session failing, the group settles in seconds."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.rollout.gec_agent_loop import GecAgentLoop

    statuses = []

    async def kv_put(key, partition_id, tag):
        statuses.append(tag["status"])

    monkeypatch.setattr(agent_loop_tq, "tq", types.SimpleNamespace(async_kv_put=kv_put))
    config = make_config(reward_path, edit_scope="all_wrong_groups")
    config.actor_rollout_ref.rollout.n = 3
    config.actor_rollout_ref.rollout.agent = {"default_agent_loop": "gec_agent"}

    async def run_agent_loop(sampling_params, trajectory, trace=False, **kwargs):
        server = FailingServer(tok, RuntimeError("the engine died")) if kwargs["session_id"] == 1 else FakeServer(tok)
        loop = GecAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tok,
                            processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))
        return await loop.run(sampling_params, **kwargs)

    fake = types.SimpleNamespace(config=config, _run_agent_loop=run_agent_loop)
    worker = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    prompt = dict(sample(uid="v1-failing"), global_steps=1)
    asyncio.run(asyncio.wait_for(worker._run_prompt(fake, prompt, dict(TRAIN_SP), {"validate": False}), 5.0))
    assert statuses == ["running", "failure"]


@pytest.mark.parametrize("sibling", ["right", "wrong"])
def test_what_a_failure_costs_a_group_in_verls_v1_run_prompt(tok, reward_path, verl_loop, sibling, monkeypatch):
    """edit_scope=all_wrong_groups, through verl's own v1 ``_run_prompt``, a group of three whose session 1 fails
    first, then session 0 (wrong) and session 2 report: with session 2 right, the group keeps both (the failure
    costs one sample, the wrong one waiting is not failed by it); with all wrong, it keeps none (the group cannot
    be decided: the failed sample and its n - 1 wrong siblings). verl marks the group failed either way."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.rollout.gec_agent_loop import _FIRST_ATTEMPTS, GecAgentLoop

    statuses, kept = [], []

    async def kv_put(key, partition_id, tag):
        statuses.append(tag["status"])

    monkeypatch.setattr(agent_loop_tq, "tq", types.SimpleNamespace(async_kv_put=kv_put))
    config = make_config(reward_path, edit_scope="all_wrong_groups")
    config.actor_rollout_ref.rollout.n = 3
    config.actor_rollout_ref.rollout.agent = {"default_agent_loop": "gec_agent"}
    uid = f"v1-cost-{sibling}"
    servers = [GatedServer(tok), GatedServer(tok, error=RuntimeError("the engine died")),
               GatedServer(tok, first=FIRST_RIGHT if sibling == "right" else FIRST_WRONG)]

    async def run_agent_loop(sampling_params, trajectory, trace=False, **kwargs):
        loop = GecAgentLoop(trainer_config=DictConfigWrap(config), server_manager=servers[kwargs["session_id"]],
                            tokenizer=tok, processor=None, dataset_cls=RLHFDataset,
                            data_config=DictConfigWrap(config.data))
        out = await loop.run(sampling_params, **kwargs)
        kept.append(kwargs["session_id"])
        return out

    fake = types.SimpleNamespace(config=config, _run_agent_loop=run_agent_loop)
    worker = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    prompt = dict(sample(uid=uid), global_steps=1)

    def group():
        return _FIRST_ATTEMPTS._open.get((uid, 1))

    async def main():
        run = asyncio.create_task(worker._run_prompt(fake, prompt, dict(TRAIN_SP), {"validate": False}))
        for i, counter in ((1, "failed"), (0, "reported"), (2, None)):
            await _until(lambda: group() is not None)
            servers[i].gate.set()
            if counter is not None:
                await _until(lambda c=counter: getattr(group(), c) == 1)
        await asyncio.wait_for(run, 5.0)

    asyncio.run(main())
    assert statuses == ["running", "failure"]
    assert sorted(kept) == ([0, 2] if sibling == "right" else [])
    assert group() is None


class GatedServer(FakeServer):
    """A first attempt generated only once the test opens its gate (``first``: right or wrong; ``error``: raises
    instead), so a group's members report in an order the test sets, whatever the machine's speed."""

    def __init__(self, tok, first=FIRST_WRONG, error=None):
        super().__init__(tok, first=first)
        self.gate, self.error = asyncio.Event(), error

    async def generate(self, request_id, **kwargs):
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return await super().generate(request_id, **kwargs)


def _gated_group(tok, config, servers, uid, script, monkeypatch):
    """Runs one group, a ``GatedServer`` per sample, as concurrent tasks; ``script(servers, tasks, reported)``
    (async) opens the gates in its order, ``reported()`` counting the first attempts reported to the group so far.
    Returns each sample's output or exception."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.rollout.gec_agent_loop import _FIRST_ATTEMPTS, GecAgentLoop

    reports = []
    report = _FIRST_ATTEMPTS.all_wrong

    def counted(key, *args, **kwargs):
        reports.append(key)
        return report(key, *args, **kwargs)

    monkeypatch.setattr(_FIRST_ATTEMPTS, "all_wrong", counted)

    async def main():
        loops = [GecAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tok,
                              processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))
                 for server in servers]
        tasks = [asyncio.create_task(loop.run(dict(TRAIN_SP), **sample(uid=uid))) for loop in loops]
        await asyncio.wait_for(script(servers, tasks, lambda: len(reports)), 10.0)
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10.0)

    return asyncio.run(main())


async def _until(condition):
    """Yields to the event loop until ``condition()`` holds (the caller bounds the wait)."""
    while not condition():
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("order", ["failure, then a right one", "right one, then the failure"])
def test_a_failed_sample_leaves_its_group_to_be_decided_by_a_right_sibling(tok, reward_path, verl_loop, order,
                                                                          monkeypatch):
    """edit_scope=all_wrong_groups, a group of four: a wrong first attempt, one sample whose generation raises, a right
    first attempt and a wrong one that reports last. A failure decides nothing while a sibling still runs: the wrong
    one waiting goes on waiting, and a right first attempt, before or after the failure, makes the group not all
    wrong for every wrong one (left as sampled). The failure costs only the failed sample."""
    config = make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0, edit_scope="all_wrong_groups")
    config.actor_rollout_ref.rollout.n = 4
    uid = "mixed-" + order.split(",")[0]
    engine_error = RuntimeError("the engine died")
    servers = [GatedServer(tok), GatedServer(tok, error=engine_error), GatedServer(tok, first=FIRST_RIGHT),
               GatedServer(tok)]
    wrong_first, failing, right, wrong_last = range(4)

    async def script(servers, tasks, reported):
        servers[wrong_first].gate.set()
        await _until(lambda: reported() == 1)  # waiting for its group
        steps = [failing, right] if order.startswith("failure") else [right, failing]
        for n, i in enumerate(steps):
            servers[i].gate.set()
            await _until(tasks[i].done)
            await asyncio.sleep(0.05)
            decided = right in steps[:n + 1]  # the waiting wrong one has its verdict once the right one reported
            assert tasks[wrong_first].done() == decided, f"after sample {i}: {tasks[wrong_first]}"
        servers[wrong_last].gate.set()

    results = _gated_group(tok, config, servers, uid, script, monkeypatch)
    assert results[failing] is engine_error
    assert results[right].extra_fields["gec_branch"] == "none" and results[right].reward_score == 1.0
    for i in (wrong_first, wrong_last):
        assert not isinstance(results[i], BaseException), results[i]
        assert results[i].extra_fields["gec_branch"] == "group_not_all_wrong"
    from verl_ext.rollout.gec_agent_loop import _FIRST_ATTEMPTS

    assert not [key for key in _FIRST_ATTEMPTS._open if key[0] == uid]


@pytest.mark.parametrize("failing", [0, 1, 3])
def test_a_failed_sample_in_a_group_without_a_right_first_attempt_fails_its_wrong_siblings(
        tok, reward_path, verl_loop, failing, monkeypatch):
    """edit_scope=all_wrong_groups, a group of four whose first attempts that were scored are all wrong, one sample
    failing first, between or last: no wrong one is stopped while a sibling still runs (it could be right); once the
    last one reported or failed, the group cannot be decided (the failed one's first attempt is unknown) and every
    wrong one raises, naming the group and the failure."""
    config = make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0, edit_scope="all_wrong_groups")
    config.actor_rollout_ref.rollout.n = 4
    uid = f"undecidable-{failing}"
    engine_error = RuntimeError("the engine died")
    servers = [GatedServer(tok, error=engine_error if i == failing else None) for i in range(4)]

    async def script(servers, tasks, reported):
        for i in range(4):
            servers[i].gate.set()
            if i == failing:
                await _until(tasks[i].done)
            else:
                await _until(lambda i=i: reported() == i + 1 - (i > failing))
            await asyncio.sleep(0.05)
            if i < 3:  # a sibling still runs: no wrong one stops
                assert not [j for j in range(4) if j != failing and tasks[j].done()], f"after sample {i}"

    results = _gated_group(tok, config, servers, uid, script, monkeypatch)
    assert results[failing] is engine_error
    for i in set(range(4)) - {failing}:
        assert isinstance(results[i], RuntimeError), results[i]
        message = str(results[i])
        assert uid in message and "edit_scope=all_wrong_groups" in message and "the engine died" in message
        assert "1 of its 4 samples failed" in message
    from verl_ext.rollout.gec_agent_loop import _FIRST_ATTEMPTS

    assert not [key for key in _FIRST_ATTEMPTS._open if key[0] == uid]


@pytest.mark.parametrize("slow_first", [FIRST_WRONG, FIRST_RIGHT])
def test_a_slow_sibling_outlives_a_short_group_wait(tok, reward_path, verl_loop, slow_first, monkeypatch):
    """algorithm.gec.group_wait_s=0.2: the wrong first attempt stops after 0.2 s with an error naming the setting
    while its sibling is still generating; the slow sibling, when it arrives, is not held to that wait: it finds
    every first attempt of its group reported and goes on (edited when all were wrong, as sampled when right)."""
    config = make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0, edit_scope="all_wrong_groups",
                         group_wait_s=0.2)
    config.actor_rollout_ref.rollout.n = 2
    uid = f"slow-{slow_first[-2]}"

    async def script(servers, tasks, reported):
        servers[0].gate.set()
        await _until(tasks[0].done)  # gave up on its sibling
        servers[1].gate.set()

    start = time.perf_counter()
    fast, slow = _gated_group(tok, config, [GatedServer(tok), GatedServer(tok, first=slow_first)], uid, script,
                              monkeypatch)
    assert time.perf_counter() - start < 5.0
    assert isinstance(fast, RuntimeError), fast
    assert "algorithm.gec.group_wait_s=0.2" in str(fast) and uid in str(fast)
    expected = "answer" if slow_first == FIRST_WRONG else "none"
    assert slow.extra_fields["gec_branch"] == expected


def test_without_a_group_wait_a_wrong_first_attempt_waits_as_long_as_its_sibling_runs(tok, reward_path, verl_loop,
                                                                                      monkeypatch):
    """group_wait_s null (the default): no clock of GEC's own, as verl has none on a sample's generation; a wrong
    first attempt is still waiting for its group 1 s after it reported, and goes on once its sibling reports."""
    assert GecConfig().group_wait_s is None
    config = make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0, edit_scope="all_wrong_groups")
    config.actor_rollout_ref.rollout.n = 2

    async def script(servers, tasks, reported):
        servers[0].gate.set()
        await _until(lambda: reported() == 1)
        await asyncio.sleep(1.0)
        assert not tasks[0].done()
        servers[1].gate.set()

    results = _gated_group(tok, config, [GatedServer(tok), GatedServer(tok)], "no-clock", script, monkeypatch)
    assert [r.extra_fields["gec_branch"] for r in results] == ["answer", "answer"]


def test_a_group_whose_other_samples_never_start_here_stops_with_the_cause_named(tok, reward_path, verl_loop,
                                                                                 monkeypatch):
    """rollout.n=3 but only two samples of the group run in this worker (a group split across agent-loop workers,
    or verl's per-prompt ``__rollout_n__`` below rollout.n): once both reported and no third one started, the wrong
    ones stop with an error naming the cause, instead of waiting for a sample that never comes."""
    import verl_ext.rollout.gec_agent_loop as module

    monkeypatch.setattr(module, "SIBLING_START_GRACE_S", 0.2)
    config = make_config(reward_path, edit_scope="all_wrong_groups")
    config.actor_rollout_ref.rollout.n = 3

    async def script(servers, tasks, reported):
        for server in servers:
            server.gate.set()

    results = _gated_group(tok, config, [GatedServer(tok), GatedServer(tok)], "split", script, monkeypatch)
    for result in results:
        assert isinstance(result, RuntimeError), result
        assert "only 2 of its 3 samples" in str(result) and "__rollout_n__" in str(result)
    assert not [key for key in module._FIRST_ATTEMPTS._open if key[0] == "split"]


def test_guard_counted_in_gec_metrics():
    import numpy as np

    from verl_ext.trainer.gec_metrics import gec_step_metrics

    branches = ["too_short", "too_short", "answer", "none"]
    cols = {gec.KEY_BRANCH: np.array(branches, dtype=object),
            gec.KEY_SCORE_BEFORE: np.array([0.0, 0.0, 0.0, 1.0]),
            gec.KEY_CORRECT_BEFORE: np.array([False, False, False, True], dtype=object),
            gec.KEY_CONTINUATION_TOKENS: np.zeros(4, dtype=int), gec.KEY_INJECTED_TOKENS: np.array([0, 0, 3, 0]),
            gec.KEY_TRUNCATED: np.zeros(4, dtype=bool), gec.KEY_RESPONSE_LEN_BEFORE: np.array([1, 1, 4, 3]),
            gec.KEY_FIRST_HIT_CAP: np.zeros(4, dtype=bool)}
    m = gec_step_metrics(cols, np.array(["a", "a", "b", "b"], dtype=object), np.array([0.0, 0.0, 1.0, 1.0]),
                         correct_threshold=1.0)
    assert m["gec/count/too_short"] == 2.0 and m["gec/count/answer"] == 1.0


def test_branch_draw_does_not_depend_on_verls_uid(tok, reward_path, verl_loop):
    """verl's uid is a fresh uuid in every run: the branch draw must come from what a rerun repeats (the row's
    position and dataset index, the weight version), so two runs with one seed correct the same responses alike."""
    config = make_config(reward_path)
    draws = {}
    for uid in ("uuid-run-1", "uuid-run-2"):
        draws[uid] = [run_loop(tok, config, FakeServer(tok), **{**sample(uid=uid), "priority": p}).extra_fields[
            "gec_branch"] for p in range(12)]
    assert draws["uuid-run-1"] == draws["uuid-run-2"] and len(set(draws["uuid-run-1"])) > 1


# ---------------------------------------------------------------- samples of one uid, replicas, router replay


def _branches_drawn(rows) -> list[float]:
    """The first number of each row's branch draw (``GecAgentLoop._rng`` on the row's keyword arguments)."""
    from verl_ext.rollout.gec_agent_loop import GecAgentLoop

    stub = types.SimpleNamespace(gec_config=GecConfig())
    return [GecAgentLoop._rng(stub, row).random() for row in rows]


def test_the_n_samples_of_a_uid_draw_independently_v1(monkeypatch):
    """v1: verl's own ``AgentLoopWorkerTQ._run_prompt`` starts the n sessions of a prompt; each gets a draw of its own
    (reproducible: the same session draws the same)."""
    from verl.trainer.ppo.v1 import agent_loop_tq

    async def no_op(**kwargs):
        return None

    monkeypatch.setattr(agent_loop_tq, "tq", types.SimpleNamespace(async_kv_put=no_op))
    rows = []

    async def run_agent_loop(sampling_params, trajectory, trace=False, **kwargs):
        rows.append(kwargs)

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 8, "val_kwargs": {"n": 1}}}})
    fake = types.SimpleNamespace(config=config, _run_agent_loop=run_agent_loop)
    worker = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    asyncio.run(worker._run_prompt(fake, dict(sample(), global_steps=1), dict(TRAIN_SP), {"validate": False}))
    assert len(rows) == 8 and {r["uid"] for r in rows} == {"u0"}
    draws = _branches_drawn(rows)
    assert len(set(draws)) == 8 and draws == _branches_drawn(rows)


def test_the_n_samples_of_a_uid_draw_independently_legacy():
    """Legacy: verl's own ``AgentLoopManager.generate_sequences`` gives each (already repeated) row a priority."""
    import inspect

    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    seen = []

    class Worker:
        class generate_sequences:  # stands in for a Ray actor method: .remote(chunk)
            @staticmethod
            async def remote(chunk):
                seen.extend(dict(zip(chunk.non_tensor_batch, values))
                            for values in zip(*chunk.non_tensor_batch.values()))
                return DataProto(meta_info={"metrics": []})

    fake = types.SimpleNamespace(agent_loop_workers=[Worker(), Worker()], _performance_metrics=lambda m, o: {})
    columns = {k: np.array([v] * 8, dtype=object) for k, v in sample().items()}  # one prompt repeated n = 8 times
    asyncio.run(inspect.unwrap(AgentLoopManager.generate_sequences)(fake, DataProto.from_single_dict(columns)))
    assert len(seen) == 8 and {r["uid"] for r in seen} == {"u0"}
    assert len(set(_branches_drawn(seen))) == 8


def test_rows_without_a_sample_key_still_draw_independently():
    """Should verl stop passing session_id / priority, the n samples must not all draw one branch."""
    rows = [dict(sample(), global_steps=1) for _ in range(8)]
    assert len(set(_branches_drawn(rows))) == 8


def test_sample_keys_and_routing_are_checked_in_verl(monkeypatch):
    from verl.trainer.ppo.v1 import agent_loop_tq

    from verl_ext.verl_compat import (
        VerlCompatError,
        check_agent_loop_routing,
        check_agent_loop_sample_keys,
    )

    check_agent_loop_sample_keys()
    check_agent_loop_routing()
    worker = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__

    async def without_session_ids(self, prompt, sampling_params, trajectory, trace=False):
        await self._run_agent_loop(sampling_params, trajectory=trajectory, **prompt)

    monkeypatch.setattr(worker, "_run_prompt", without_session_ids)
    check_agent_loop_sample_keys.cache_clear()
    try:
        with pytest.raises(VerlCompatError, match="AgentLoopWorkerTQ._run_prompt using 'session_id'"):
            check_agent_loop_sample_keys()
    finally:
        check_agent_loop_sample_keys.cache_clear()


def test_reflection_continues_on_the_first_generations_replica(tok, reward_path, verl_loop):
    """verl's load balancer routes by request id (sticky sessions): the continuation reuses the first one's."""
    server = FakeServer(tok)
    run_loop(tok, make_config(reward_path, p_reflect=1.0, p_answer=0.0, p_solution=0.0), server)
    assert len(server.calls) == 2 and server.calls[1]["request_id"] == server.calls[0]["request_id"]


def test_router_replay_keeps_the_continuations_routing(tok, reward_path, verl_loop):
    """Router replay (MoE): the first generation's routing up to the kept core, then the continuation request's
    for cue + continuation (which the policy sampled); answer injection keeps only the core's."""
    cfg = GecConfig()
    prompt, core = prompt_of(tok), ids(tok, FIRST_WRONG)
    out = run_loop(tok, make_config(reward_path, p_reflect=1.0, p_answer=0.0, p_solution=0.0),
                   FakeServer(tok, routed_experts=True))
    cont = ids(tok, CONTINUATION) + [tok.eos_token_id]
    total = len(prompt) + len(core) + len(ids(tok, cfg.cue)) + len(cont)
    assert len(out.response_ids) + len(prompt) == total and out.routed_experts.shape == (total, 2, 2)
    assert (out.routed_experts[: len(prompt) + len(core)] == 1).all()  # first generation (call 1)
    assert (out.routed_experts[len(prompt) + len(core):] == 2).all()  # continuation request (call 2)
    answer = run_loop(tok, make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0),
                      FakeServer(tok, routed_experts=True))
    assert answer.routed_experts.shape[0] == len(prompt) + len(core)  # the template has no recorded routing


# ---------------------------------------------------------------- row data GEC cannot use: counted, then loud


def test_a_row_without_ground_truth_that_draws_the_answer_is_left_unedited_and_counted(tok, reward_path, verl_loop):
    """Was a ValueError inside the loop (v1: a failed session, its group trained short or evicted, logged only)."""
    from verl_ext.trainer.gec_metrics import GecRolloutError, check_gec_errors

    row = sample()
    row["reward_model"] = {"ground_truth": None, "style": "rule"}
    server = FakeServer(tok)
    out = run_loop(tok, make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0), server, **row)
    assert out.response_ids == ids(tok, FIRST_WRONG) + [tok.eos_token_id] and len(server.calls) == 1
    f = out.extra_fields
    assert f["gec_branch"] == "no_ground_truth" and "no reward_model.ground_truth" in f["gec_error"]
    ok = run_loop(tok, make_config(reward_path, p_reflect=0.0, p_answer=1.0, p_solution=0.0), FakeServer(tok))
    assert ok.extra_fields["gec_error"] == ""
    batch = {"extra_fields": np.array([f, ok.extra_fields, ok.extra_fields, ok.extra_fields], dtype=object)}
    m = gec_step_metrics(batch, ["g"] * 4, [0.0, 1.0, 1.0, 1.0])
    assert m["gec/errors"] == 1 and m["gec/count/no_ground_truth"] == 1
    with pytest.raises(GecRolloutError, match=r"1 of 4 training rollouts .*max_error_frac=0\.0\).*ground_truth"):
        check_gec_errors(batch, 0.0)
    check_gec_errors(batch, 0.25)  # at the threshold: counted, the run goes on
    with pytest.raises(GecRolloutError):
        check_gec_errors(batch, 0.2)


def test_unknown_row_sampling_params_on_a_gec_training_row_are_counted(tok, reward_path, verl_loop):
    row = sample()
    row["extra_info"]["sampling_params"] = {"temperature": 0.0, "temprature": 0.5}
    server = FakeServer(tok, first=FIRST_RIGHT)
    out = run_loop(tok, make_config(reward_path), server, **row)
    assert server.calls[0]["sampling_params"]["temperature"] == 0.0 and "temprature" not in server.calls[0][
        "sampling_params"]
    assert "temprature" in out.extra_fields["gec_error"] and out.extra_fields["gec_branch"] == "none"


def test_the_legacy_driver_stops_a_step_with_unusable_gec_rows(tok, reward_path, verl_loop):
    """Before the step trains (legacy: in the routed advantage call; v1: tests/unit/test_v1_advantage.py)."""
    from verl_ext.trainer.gec_metrics import GecRolloutError
    from verl_ext.trainer.legacy import ExtRayPPOTrainer

    trainer = ExtRayPPOTrainer.__new__(ExtRayPPOTrainer)
    trainer.config = OmegaConf.create({"algorithm": {"adv_estimator": "grpo", "gec": {"enable": True}}})
    bad = {"gec_branch": np.array(["no_ground_truth", "none"], dtype=object),
           "gec_error": np.array(["the row has no reward_model.ground_truth", ""], dtype=object)}
    with pytest.raises(GecRolloutError):
        trainer._check_gec_errors(bad)
    trainer._ext_config = None
    trainer.config.algorithm.gec.max_error_frac = 0.5
    trainer._check_gec_errors(bad)


# ---------------------------------------------------------------- method, not bug: GEC's rows are verl's own


class ReplayServer(FakeServer):
    """A policy that sampled ``token_ids`` itself, with the given per-token log-probs."""

    def __init__(self, tok, token_ids, log_probs):
        super().__init__(tok)
        self.token_ids, self.log_probs = list(token_ids), list(log_probs)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        return TokenOutput(token_ids=self.token_ids, log_probs=self.log_probs, routed_experts=None,
                           extra_fields={"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3})


@pytest.mark.parametrize("branch", ["reflect", "answer", "solution"])
def test_an_edited_row_is_the_row_verl_builds_had_the_policy_sampled_its_tokens(tok, reward_path, verl_loop,
                                                                                 branch):
    """GEC changes a response's text and reward, nothing else: its training row (verl's own post-processing and
    reward loop) equals field by field the row verl's single-turn loop builds when the policy samples the same final
    token sequence, and so do the old log-probs the actor recomputes from it (a small random Qwen2 here, through
    verl's ``logprobs_from_logits``). Only the rollout's log-probs of the injected tokens differ (0.0: nobody
    sampled them), which only ``rollout.calculate_log_probs`` diagnostics read."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from verl.utils.torch_functional import logprobs_from_logits

    from verl_ext.rollout.gec_agent_loop import reward_manager_of

    probs = {"reflect": (1.0, 0.0, 0.0), "answer": (0.0, 1.0, 0.0), "solution": (0.0, 0.0, 1.0)}[branch]
    config = make_config(reward_path, response_length=96, max_continuation_tokens=32, p_reflect=probs[0],
                         p_answer=probs[1], p_solution=probs[2])
    edited = run_loop(tok, config, FakeServer(tok))
    assert edited.extra_fields["gec_branch"] == branch
    sampled = run_loop(tok, make_config(reward_path, response_length=96, enable=False),
                       ReplayServer(tok, edited.response_ids, [lp if lp != 0.0 else -1.0 for lp in edited.response_logprobs]),
                       agent_cls=SingleTurnAgentLoop)
    assert sampled.response_ids == edited.response_ids

    async def compute_score(data):  # what RewardLoopWorker.compute_score does without a reward model
        return await reward_manager_of(config, tok).run_single(data)

    handle = types.SimpleNamespace(compute_score=types.SimpleNamespace(remote=compute_score))
    a = verl_postprocess(tok, config, [edited], reward_handles=[handle])
    b = verl_postprocess(tok, config, [sampled], reward_handles=[handle])
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask", "rm_scores"):
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert a.batch["rm_scores"].sum().item() == 1.0  # the corrected response is right, for both
    injected = torch.tensor([lp == 0.0 for lp in edited.response_logprobs])
    assert injected.any()
    width = len(edited.response_ids)
    assert torch.equal(a.batch["rollout_log_probs"][0, :width] == b.batch["rollout_log_probs"][0, :width],
                       ~injected)

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=256)).eval()

    def old_log_probs(data):  # what verl's actor computes for the response positions
        with torch.no_grad():
            logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                           position_ids=data.batch["position_ids"]).logits
        n = data.batch["responses"].shape[1]
        return logprobs_from_logits(logits[:, -n - 1:-1], data.batch["responses"])

    assert torch.equal(old_log_probs(a), old_log_probs(b))


@pytest.mark.parametrize("training", [True, False])
def test_v1_requests_are_named_by_their_sample_under_full_determinism(tok, reward_path, verl_loop, training):
    """verl's single-turn loop names a request ``det-<priority>``; v1 passes no priority, so every v1 request would be
    ``det-0`` and a seeded backend could tell a group's samples apart only by arrival order. The loop names it by the
    sample (dataset row, session), GEC on (training) or off (validation), and the reflection keeps that name; the
    legacy trainer's (priority per row) and runs without full_determinism keep verl's."""
    config = make_config(reward_path, p_reflect=1.0, p_answer=0.0, p_solution=0.0)
    config.actor_rollout_ref.rollout.full_determinism = True
    row = {**sample(training=training), "index": 7}
    for kwargs, expected in (({**row, "session_id": 3}, "det-7-3"), ({**row, "priority": 5}, "det-5")):
        server = FakeServer(tok)
        run_loop(tok, config, server, **kwargs)
        assert [call["request_id"] for call in server.calls] == [expected] * (2 if training else 1)
    config.actor_rollout_ref.rollout.full_determinism = False
    server = FakeServer(tok)
    run_loop(tok, config, server, **{**row, "session_id": 3})
    assert not server.calls[0]["request_id"].startswith("det-")

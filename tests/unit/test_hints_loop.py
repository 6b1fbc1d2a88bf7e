"""``algorithm.gec.mode=hint`` in the gec_agent loop (docs/hints.md), with a fake server.

The loop runs as in test_gec.py: verl's real SingleTurnAgentLoop code and reward manager (test_gec.py's reward file:
1.0 for ``\\boxed{5}``), a server that answers from the prompt it is given (a hint's level is read off the prompt's
text), and groups as verl's agent-loop worker runs them (concurrent tasks of one event loop).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.unit import test_gec as base
from tests.unit.test_gec import FIRST_RIGHT, FIRST_WRONG, TRAIN_SP, ids, make_config, prompt_of, sample
from verl_ext.rollout import gec, hints

tok, reward_path, verl_loop = base.tok, base.reward_path, base.verl_loop  # the fixtures of test_gec.py

# four step ends before the answer (the math rule: line ends), so levels 0.25 / 0.5 / 0.75 keep 1 / 2 / 3 lines
SOLUTION = "Start at 2.\nAdd 1.\nAdd 1.\nAdd 1.\nSo \\boxed{5}"
HINTS = ["Start at 2.", "Start at 2.\nAdd 1.", "Start at 2.\nAdd 1.\nAdd 1."]


class HintServer:
    """A policy that writes ``first`` without a hint and ``hinted[level]`` after the hint of that level; every call
    gets log-probs of its own (``-(call number) / 8``), so a row shows which call it came from."""

    def __init__(self, tok, first=FIRST_WRONG, hinted=(FIRST_WRONG, FIRST_WRONG, FIRST_WRONG), routed_experts=False):
        self.tok, self.first, self.hinted, self.routed_experts = tok, first, list(hinted), routed_experts
        self.calls = []

    def level(self, prompt_ids) -> int | None:
        text = self.tok.decode(prompt_ids)
        return text.count("Add 1.") if HINTS[0] in text else None

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        import numpy as np
        from verl.workers.rollout.replica import TokenOutput

        level = self.level(prompt_ids)
        text = self.first if level is None else self.hinted[level]
        token_ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        token_ids = token_ids[: sampling_params.get("max_tokens", len(token_ids))]
        number = len(self.calls) + 1
        log_probs = [-number / 8] * len(token_ids)
        routing = (np.full((len(prompt_ids) + len(token_ids), 2, 2), number, dtype=np.int32)
                   if self.routed_experts else None)
        self.calls.append({"prompt_ids": list(prompt_ids), "request_id": request_id, "level": level,
                           "token_ids": token_ids, "log_probs": log_probs, "max_tokens": sampling_params.get("max_tokens")})
        await asyncio.sleep(0)  # let a group's members interleave, as a server does
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, routed_experts=routing,
                           extra_fields={"global_steps": 4, "min_global_steps": 4, "max_global_steps": 4})


def hint_config(reward_path, n=1, **gec_overrides):
    config = make_config(reward_path, mode="hint", **gec_overrides)
    config.actor_rollout_ref.rollout.n = n
    return config


def row(uid="u0", solution=SOLUTION, **more):
    return {**sample(solution=solution, uid=uid), **more}


def run_group(tok, config, servers, **row_kwargs):
    """One group's samples (one server each) as verl's agent-loop worker runs them."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.rollout.gec_agent_loop import GecAgentLoop

    async def main():
        loops = [GecAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tok,
                              processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))
                 for server in servers]
        return await asyncio.gather(*(loop.run(dict(TRAIN_SP), **row(**row_kwargs)) for loop in loops))

    return asyncio.run(main())


def run_one(tok, config, server, **row_kwargs):
    return run_group(tok, config, [server], **row_kwargs)[0]


def hint_fields(out) -> tuple:
    f = out.extra_fields
    return f[hints.KEY_HINT_LEVEL], f[hints.KEY_HINT_ATTEMPTS], f[hints.KEY_HINT_SKIP], f[hints.KEY_HINT_TOO_LONG]


def assert_is_call(out, call, prompt_ids):
    """``out`` is the row of the server's ``call``: the hinted prompt, the call's tokens and log-probs, all trained."""
    assert out.prompt_ids == prompt_ids == call["prompt_ids"]
    assert out.response_ids == call["token_ids"]
    assert out.response_mask == [1] * len(call["token_ids"])
    assert out.response_logprobs == call["log_probs"]
    assert out.extra_fields[gec.KEY_SPANS] == [[gec.SPAN_POLICY, 0, len(call["token_ids"])]]


def assert_untouched(out, server):
    """``out`` is its first attempt as sampled: the original prompt, the first call's tokens and log-probs."""
    assert_is_call(out, server.calls[0], prompt_of(server.tok))
    assert server.calls[0]["level"] is None


# ---------------------------------------------------------------- one sample: the hinted row


def test_a_hinted_row_is_the_hinted_prompt_and_the_policys_own_tokens_assistant_prefix(tok, reward_path, verl_loop):
    server = HintServer(tok, hinted=[FIRST_RIGHT] * 3)
    out = run_one(tok, hint_config(reward_path), server)
    assert [c["level"] for c in server.calls] == [None, 0]
    # the assistant turn starts with the hint: prompt context, outside the response and its mask
    assert_is_call(out, server.calls[1], prompt_of(tok) + ids(tok, HINTS[0]))
    assert out.response_ids == ids(tok, FIRST_RIGHT) + [tok.eos_token_id]
    assert out.reward_score == 1.0 and out.extra_fields["reward_extra_info"] == {"acc": 1.0}
    assert hint_fields(out) == (0, [[0, True]], "", 0)
    f = out.extra_fields  # GEC's fields describe the first attempt, the final response is all policy tokens
    assert (f[gec.KEY_BRANCH], f[gec.KEY_CORRECT_BEFORE], f[gec.KEY_SCORE_BEFORE], f[gec.KEY_INJECTED_TOKENS]) == (
        "none", False, 0.0, 0)
    assert f[gec.KEY_RESPONSE_LEN_BEFORE] == len(ids(tok, FIRST_WRONG)) + 1
    # the hinted sample had the first attempt's budget: the whole response length (nothing is edited after it)
    assert server.calls[1]["max_tokens"] == server.calls[0]["max_tokens"] == 512
    assert server.calls[1]["request_id"] == f"{server.calls[0]['request_id']}-hint0"


def test_a_hinted_row_with_the_user_placement_is_the_row_verls_single_turn_builds(tok, reward_path, verl_loop):
    """``hint_placement=user``: the template goes into the last user message, then verl's own prompt builder; the row
    equals the one verl's SingleTurnAgentLoop builds for that message when the policy samples the same tokens."""
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    template = "\nHint: {hint}"
    server = HintServer(tok, hinted=[FIRST_RIGHT] * 3)
    out = run_one(tok, hint_config(reward_path, hint_placement="user", hint_template=template), server)
    hinted_user = "What is 2+3?" + template.replace("{hint}", HINTS[0])
    assert_is_call(out, server.calls[1], prompt_of(tok, hinted_user))
    assert hint_fields(out)[:2] == (0, [[0, True]])

    replay = base.ReplayServer(tok, server.calls[1]["token_ids"], server.calls[1]["log_probs"])
    verls = base.run_loop(tok, make_config(reward_path, enable=False), replay, agent_cls=SingleTurnAgentLoop,
                          **sample(content=hinted_user))
    assert (verls.prompt_ids, verls.response_ids, verls.response_mask, verls.response_logprobs) == (
        out.prompt_ids, out.response_ids, out.response_mask, out.response_logprobs)


def test_scope_one_tries_levels_lowest_first_and_keeps_the_first_right_one(tok, reward_path, verl_loop):
    server = HintServer(tok, hinted=[FIRST_WRONG, FIRST_RIGHT, FIRST_RIGHT])
    out = run_one(tok, hint_config(reward_path), server)
    assert [c["level"] for c in server.calls] == [None, 0, 1]
    assert_is_call(out, server.calls[2], prompt_of(tok) + ids(tok, HINTS[1]))
    assert hint_fields(out) == (1, [[0, False], [1, True]], "", 0) and out.reward_score == 1.0


def test_scope_one_with_no_level_right_replaces_nothing(tok, reward_path, verl_loop):
    server = HintServer(tok)
    out = run_one(tok, hint_config(reward_path), server)
    assert [c["level"] for c in server.calls] == [None, 0, 1, 2]
    assert_untouched(out, server)
    assert hint_fields(out) == (-1, [[0, False], [1, False], [2, False]], "", 0) and out.reward_score == 0.0


def test_a_right_first_attempt_is_not_hinted(tok, reward_path, verl_loop):
    server = HintServer(tok, first=FIRST_RIGHT, hinted=[FIRST_RIGHT] * 3)
    out = run_one(tok, hint_config(reward_path), server)
    assert len(server.calls) == 1
    assert_untouched(out, server)
    assert hint_fields(out) == (-1, [], "", 0) and out.reward_score == 1.0


def test_the_hinted_row_keeps_its_own_routing(tok, reward_path, verl_loop):
    server = HintServer(tok, hinted=[FIRST_RIGHT] * 3, routed_experts=True)
    out = run_one(tok, hint_config(reward_path), server)
    width = len(out.prompt_ids) + len(out.response_ids)
    assert out.routed_experts.shape[0] == width and (out.routed_experts == 2).all()  # the second call's


def test_hinted_requests_are_named_by_their_sample_and_level_under_full_determinism(tok, reward_path, verl_loop):
    config = hint_config(reward_path)
    config.actor_rollout_ref.rollout.full_determinism = True
    server = HintServer(tok, hinted=[FIRST_WRONG, FIRST_RIGHT, FIRST_RIGHT])
    run_one(tok, config, server, index=7, session_id=3)
    assert [c["request_id"] for c in server.calls] == ["det-7-3", "det-7-3-hint0", "det-7-3-hint1"]


# ---------------------------------------------------------------- groups


def test_scope_one_replaces_exactly_one_member_and_only_in_all_wrong_groups(tok, reward_path, verl_loop):
    config = hint_config(reward_path, n=3)
    servers = [HintServer(tok, hinted=[FIRST_RIGHT] * 3) for _ in range(3)]
    outs = run_group(tok, config, servers, uid="hard")
    assert [hint_fields(o)[0] for o in outs] == [0, -1, -1]
    assert [len(s.calls) for s in servers] == [2, 1, 1]
    assert_is_call(outs[0], servers[0].calls[1], prompt_of(tok) + ids(tok, HINTS[0]))
    for out, server in zip(outs[1:], servers[1:]):
        assert_untouched(out, server)
        assert hint_fields(out) == (-1, [], "", 0)
    assert [o.reward_score for o in outs] == [1.0, 0.0, 0.0]  # GRPO over the mixed group

    outs = run_unhinted_group(tok, config, (FIRST_WRONG, FIRST_RIGHT, FIRST_WRONG), uid="mixed")
    assert all(hint_fields(out) == (-1, [], "", 0) for out in outs)
    assert [o.extra_fields[gec.KEY_BRANCH] for o in outs] == ["group_not_all_wrong", "none", "group_not_all_wrong"]


def run_unhinted_group(tok, config, firsts, uid):
    """A group with a right first attempt (``firsts``): one generation per member, every output as sampled."""
    servers = [HintServer(tok, first=first, hinted=[FIRST_RIGHT] * 3) for first in firsts]
    outs = run_group(tok, config, servers, uid=uid)
    assert [len(s.calls) for s in servers] == [1] * len(firsts)
    for out, server in zip(outs, servers):
        assert_untouched(out, server)
    return outs


def test_scope_all_regenerates_the_group_and_raises_the_level_while_it_stays_all_wrong(tok, reward_path, verl_loop):
    config = hint_config(reward_path, n=3, hint_scope="all")
    # level 0: all wrong; level 1: the second member is right -> the group stops at level 1, every member at it
    servers = [HintServer(tok, hinted=[FIRST_WRONG, right, right]) for right in (FIRST_WRONG, FIRST_RIGHT,
                                                                                 FIRST_WRONG)]
    outs = run_group(tok, config, servers, uid="escalates")
    assert [[c["level"] for c in s.calls] for s in servers] == [[None, 0, 1]] * 3
    for out, server in zip(outs, servers):
        assert_is_call(out, server.calls[2], prompt_of(tok) + ids(tok, HINTS[1]))
        assert hint_fields(out)[0] == 1
    assert [hint_fields(o)[1] for o in outs] == [[[0, False], [1, False]], [[0, False], [1, True]],
                                                [[0, False], [1, False]]]
    assert [o.reward_score for o in outs] == [0.0, 1.0, 0.0]

    # never right: every level tried, the group ends all hinted at the last one (GHPO keeps its last regeneration)
    servers = [HintServer(tok) for _ in range(3)]
    outs = run_group(tok, config, servers, uid="stays_wrong")
    assert [[c["level"] for c in s.calls] for s in servers] == [[None, 0, 1, 2]] * 3
    for out, server in zip(outs, servers):
        assert_is_call(out, server.calls[3], prompt_of(tok) + ids(tok, HINTS[2]))
        assert hint_fields(out)[0] == 2

    # right at once at level 0: the group stops there
    servers = [HintServer(tok, hinted=[right, FIRST_RIGHT, FIRST_RIGHT]) for right in (FIRST_RIGHT, FIRST_WRONG,
                                                                                        FIRST_WRONG)]
    outs = run_group(tok, config, servers, uid="level0")
    assert [[c["level"] for c in s.calls] for s in servers] == [[None, 0]] * 3
    assert [hint_fields(o)[0] for o in outs] == [0, 0, 0]

    # a right first attempt: nobody is hinted
    run_unhinted_group(tok, config, (FIRST_WRONG, FIRST_WRONG, FIRST_RIGHT), uid="mixed")
    from verl_ext.rollout.gec_agent_loop import _FIRST_ATTEMPTS

    assert not _FIRST_ATTEMPTS._open  # every barrier, first attempts' and levels', was settled and removed


def test_scope_all_a_member_failing_at_a_level_stops_its_wrong_siblings(tok, reward_path, verl_loop):
    """A hinted generation that raises resolves its level's barrier: the siblings still wrong there stop with an
    error naming the failure (as at the first attempts' barrier) instead of waiting for ever."""

    class FailsAtLevel1(HintServer):
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            if self.level(prompt_ids) == 1:
                raise RuntimeError("the engine died")
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)

    config = hint_config(reward_path, n=2, hint_scope="all")
    with pytest.raises(RuntimeError, match="the engine died"):
        run_group(tok, config, [HintServer(tok), FailsAtLevel1(tok)], uid="dies")
    from verl_ext.rollout.gec_agent_loop import _FIRST_ATTEMPTS

    assert not _FIRST_ATTEMPTS._open


# ---------------------------------------------------------------- what is never hinted, and what is skipped


def test_validation_rows_are_verls_single_turn(tok, reward_path, verl_loop):
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    server = HintServer(tok, hinted=[FIRST_RIGHT] * 3)
    validation = {**row(), base.TRAINING_ROLLOUT_KEY: False}
    out = base.run_loop(tok, hint_config(reward_path), server, **validation)
    assert len(server.calls) == 1 and out.prompt_ids == prompt_of(tok)
    assert not any(k.startswith(("gec_", "hint_")) for k in out.extra_fields)
    verls = base.run_loop(tok, hint_config(reward_path), HintServer(tok), agent_cls=SingleTurnAgentLoop, **validation)
    a, b = out.model_dump(), verls.model_dump()
    a["metrics"].pop("generate_sequences"), b["metrics"].pop("generate_sequences")
    assert a == b


@pytest.mark.parametrize("step, hinted", [(2, False), (3, True)])
def test_the_warm_up_is_respected(tok, reward_path, verl_loop, step, hinted):
    """hint_warmup_steps=2: steps 1-2 unhinted (no barrier either), hints from step 3."""
    server = HintServer(tok, hinted=[FIRST_RIGHT] * 3)
    out = run_one(tok, hint_config(reward_path, hint_warmup_steps=2), server, global_steps=step)
    assert len(server.calls) == (2 if hinted else 1)
    assert hint_fields(out)[0] == (0 if hinted else -1)


@pytest.mark.parametrize("solution, room, skip, too_long, calls", [  # room: prompt_length less the row's prompt
    (None, 64, hints.SKIP_NO_SOLUTION, 0, 1),
    ("\\boxed{5}", 64, hints.SKIP_NO_STEP, 0, 1),
    (SOLUTION, len(HINTS[0]) - 1, hints.SKIP_PROMPT_TOO_LONG, 3, 1),  # no level fits (byte-level tokens)
    (SOLUTION, len(HINTS[1]), "", 1, 3),  # levels 0 and 1 fit (both tried, wrong), level 2 is left out
])
def test_rows_that_cannot_be_hinted_are_skipped_and_counted_never_cut(tok, reward_path, verl_loop, solution,
                                                                        room, skip, too_long, calls):
    prompt_length = len(prompt_of(tok)) + room
    config = make_config(reward_path, prompt_length=prompt_length, mode="hint")
    config.actor_rollout_ref.rollout.n = 2
    servers = [HintServer(tok) for _ in range(2)]
    outs = run_group(tok, config, servers, uid=f"skip-{skip}-{room}", solution=solution)
    assert [len(s.calls) for s in servers] == [calls, 1]
    assert all(len(c["prompt_ids"]) <= prompt_length for s in servers for c in s.calls)
    for out, server in zip(outs, servers):
        assert_untouched(out, server)
        assert hint_fields(out)[2:] == (skip, too_long)
    metrics = hints.hint_step_metrics([o.extra_fields for o in outs], ["g", "g"], n_levels=3)
    assert metrics["hint/levels_too_long"] == too_long
    if skip:
        assert metrics[f"hint/skipped/{skip}"] == 1.0 and metrics["hint/groups_hinted"] == 0.0
    else:
        assert metrics["hint/groups_hinted"] == 1.0 and metrics["hint/level1/samples"] == 1.0


def test_the_step_metrics_fold_the_rows_fields(tok, reward_path, verl_loop):
    config = hint_config(reward_path, n=3, hint_scope="all")
    servers = [HintServer(tok, hinted=[FIRST_WRONG, right, right]) for right in (FIRST_WRONG, FIRST_RIGHT,
                                                                                 FIRST_WRONG)]
    outs = run_group(tok, config, servers, uid="metrics")
    metrics = hints.hint_step_metrics([o.extra_fields for o in outs], ["g"] * 3, n_levels=3)
    assert metrics["hint/groups_hinted"] == 1.0 and metrics["hint/replaced"] == 3.0
    assert (metrics["hint/level0/samples"], metrics["hint/level0/acc"]) == (3.0, 0.0)
    assert (metrics["hint/level1/samples"], metrics["hint/level1/acc"]) == (3.0, 1 / 3)
    assert metrics["hint/level2/samples"] == 0.0 and "hint/level2/acc" not in metrics


def test_hinted_rows_reach_verls_batch_as_sampled_rows(tok, reward_path, verl_loop):
    """verl's own post-processing of a group with one hinted member (legacy columns; v1 dicts): the hint sits in the
    prompt part, the response mask and rollout log-probs are the hinted generation's, the loop's scores are final (not
    scored again), every row has the hint columns, and verl_ext's rollout diagnostics count every token as sampled."""
    import torch
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from verl_ext.trainer.rollout_diagnostics import injected_token_frac, spans_of_rows

    config = hint_config(reward_path, n=3)
    servers = [HintServer(tok, hinted=[FIRST_RIGHT] * 3) for _ in range(3)]
    outs = run_group(tok, config, servers, uid="batch")
    data = base.verl_postprocess(tok, config, outs)
    columns = data.non_tensor_batch
    assert [list(columns[k]) for k in hints.HINT_EXTRA_KEYS] == [[0, -1, -1], [[[0, True]], [], []], [""] * 3, [0] * 3]
    hinted_prompt = prompt_of(tok) + ids(tok, HINTS[0])
    width = len(outs[0].response_ids)
    assert data.batch["prompts"][0, -len(hinted_prompt):].tolist() == hinted_prompt  # left-padded, as any prompt
    assert data.batch["responses"][0, :width].tolist() == servers[0].calls[1]["token_ids"]
    assert data.batch["response_mask"][0].sum().item() == width
    assert data.batch["rollout_log_probs"][0, :width].tolist() == servers[0].calls[1]["log_probs"]
    assert data.batch["rm_scores"].sum(-1).tolist() == [1.0, 0.0, 0.0]
    spans = spans_of_rows(columns, 3)
    assert injected_token_frac(data.batch["response_mask"], spans) == 0.0
    # v1: one dict per sample, the fields inside its extra_fields
    rows = [o.as_dict() for o in outs]
    assert rows[0]["extra_fields"][hints.KEY_HINT_LEVEL] == 0
    assert torch.equal(rows[0]["prompts"], torch.tensor(hinted_prompt))
    assert len(list_of_dict_to_tensordict(rows)) == 3
    # the step's hint/* metrics as both trainers fold them (ExtTrainerMixin._gec_metrics), with GEC's
    from verl_ext.config import load_algorithm_config
    from verl_ext.trainer.gec_metrics import is_count_metric
    from verl_ext.trainer.mixin import ExtTrainerMixin

    trainer = ExtTrainerMixin.__new__(ExtTrainerMixin)
    trainer._ext_config = load_algorithm_config(config.algorithm)
    for batch in (columns, {"extra_fields": [o.extra_fields for o in outs]}):  # legacy columns; v1 extra_fields
        metrics = trainer._gec_metrics(batch, ["batch"] * 3, torch.tensor([1.0, 0.0, 0.0]))
        assert (metrics["hint/groups_hinted"], metrics["hint/replaced"], metrics["hint/level0/acc"]) == (1.0, 1.0, 1.0)
        assert "gec/acc_before" in metrics
    assert is_count_metric("hint/replaced") and is_count_metric("hint/level0/samples")
    assert not is_count_metric("hint/level0/acc")

"""Seeing what GEC wrote: the spans the gec_agent loop records, the columns added to verl's rollout dump, the page.

The agent loop runs as in test_gec.py (verl's SingleTurnAgentLoop, verl's reward manager, a fake server); the dump
lines are written by verl's own ``_write_generations`` (legacy and v1), then rendered by ``report --samples``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import types

import pytest

from tests.unit import test_gec as base
from tests.unit.test_gec import (
    CONTINUATION,
    FIRST_WRONG,
    SOLUTION,
    FakeServer,
    ids,
    make_config,
    run_loop,
    sample,
)
from verl_ext.config import GecConfig
from verl_ext.rollout import gec
from verl_ext.trainer.gec_dump import gec_dump_columns

tok, reward_path, verl_loop = base.tok, base.reward_path, base.verl_loop  # the fixtures of test_gec.py

ONLY = {"reflect": {"p_reflect": 1.0, "p_answer": 0.0, "p_solution": 0.0},
        "answer": {"p_reflect": 0.0, "p_answer": 1.0, "p_solution": 0.0},
        "solution": {"p_reflect": 0.0, "p_answer": 0.0, "p_solution": 1.0}}


def dumping(config, on=True):
    config.trainer = {"rollout_data_dir": "/tmp/x" if on else None}
    return config


def marked(out) -> dict[str, list[int]]:
    """The token ids under each non-policy span of the final response."""
    spans = out.extra_fields[gec.KEY_SPANS]
    assert spans[0][1] == 0 and spans[-1][2] == len(out.response_ids)  # the spans tile the response
    assert all(a[2] == b[1] for a, b in itertools.pairwise(spans))
    return {kind: out.response_ids[s:e] for kind, s, e in spans if kind != gec.SPAN_POLICY}


def test_spans_are_the_injected_token_ranges(tok, reward_path, verl_loop):
    cfg, eos = GecConfig(), tok.eos_token_id
    template = ids(tok, cfg.answer_template.replace("{answer}", "5"))

    out = run_loop(tok, make_config(reward_path, **ONLY["reflect"]), FakeServer(tok))
    assert marked(out) == {"cue": ids(tok, cfg.cue), "continuation": ids(tok, CONTINUATION) + [eos]}
    assert out.extra_fields[gec.KEY_SPANS][0] == ["policy", 0, len(ids(tok, FIRST_WRONG))]

    out = run_loop(tok, make_config(reward_path, **ONLY["answer"]), FakeServer(tok))
    assert marked(out) == {"answer": template, "eos": [eos]}

    out = run_loop(tok, make_config(reward_path, **ONLY["solution"]), FakeServer(tok))
    assert marked(out) == {"solution": ids(tok, SOLUTION), "eos": [eos]}
    assert [s[0] for s in out.extra_fields[gec.KEY_SPANS]] == ["solution", "eos"]  # no policy token left

    out = run_loop(tok, make_config(reward_path, **ONLY["solution"]), FakeServer(tok), **sample(solution=None))
    assert out.extra_fields[gec.KEY_BRANCH] == "solution_fallback" and marked(out) == {"answer": template,
                                                                                        "eos": [eos]}

    out = run_loop(tok, make_config(reward_path), FakeServer(tok, first="The sum is \\boxed{5}"))
    assert out.extra_fields[gec.KEY_BRANCH] == "none" and marked(out) == {}
    assert out.extra_fields[gec.KEY_SPANS] == [["policy", 0, len(out.response_ids)]]


def test_spans_of_a_continuation_cut_by_the_response_length(tok, reward_path, verl_loop):
    # a backend that over-generates the first response leaves 3 tokens of room after the cue
    cfg = GecConfig()
    core, cue = ids(tok, FIRST_WRONG), ids(tok, cfg.cue)
    length = len(core) + len(cue) + 3
    out = run_loop(tok, make_config(reward_path, response_length=length, **ONLY["reflect"]),
                   FakeServer(tok, first_ignores_max_tokens=True))
    assert out.extra_fields[gec.KEY_TRUNCATED] is True
    assert marked(out) == {"cue": cue, "continuation": ids(tok, CONTINUATION)[:3]}


def test_first_response_ids_kept_only_when_dumping_and_replaced(tok, reward_path, verl_loop):
    out = run_loop(tok, dumping(make_config(reward_path, **ONLY["solution"])), FakeServer(tok))
    assert out.extra_fields[gec.KEY_FIRST_RESPONSE_IDS] == ids(tok, FIRST_WRONG) + [tok.eos_token_id]
    out = run_loop(tok, dumping(make_config(reward_path, **ONLY["solution"]), on=False), FakeServer(tok))
    assert gec.KEY_FIRST_RESPONSE_IDS not in out.extra_fields
    out = run_loop(tok, dumping(make_config(reward_path, **ONLY["reflect"])), FakeServer(tok))
    assert out.extra_fields[gec.KEY_FIRST_RESPONSE_IDS] is None  # the final response starts with it


def test_legacy_chunks_with_and_without_a_solution_concatenate(tok, reward_path, verl_loop):
    """The legacy trainer concatenates the agent-loop workers' batches: every chunk must have the same columns."""
    from verl.protocol import DataProto

    solution = _legacy_batch(tok, reward_path, [run_loop(tok, dumping(make_config(reward_path, **ONLY["solution"])),
                                                         FakeServer(tok))])
    reflect = _legacy_batch(tok, reward_path, [run_loop(tok, dumping(make_config(reward_path, **ONLY["reflect"])),
                                                        FakeServer(tok))])
    for chunks in ([solution, reflect], [reflect, solution]):
        data = DataProto.concat(chunks)
        first = list(data.non_tensor_batch[gec.KEY_FIRST_RESPONSE_IDS])
        kept = [f for f, b in zip(first, data.non_tensor_batch[gec.KEY_BRANCH]) if b == "solution"]
        assert len(first) == 2 and kept == [ids(tok, FIRST_WRONG) + [tok.eos_token_id]]


def _outputs(tok, reward_path):
    """A reflect, an answer, a solution and an untouched response of one group, with the dump on."""
    outs = [run_loop(tok, dumping(make_config(reward_path, **ONLY[b])), FakeServer(tok))
            for b in ("reflect", "answer", "solution")]
    outs.append(run_loop(tok, dumping(make_config(reward_path)), FakeServer(tok, first="The sum is \\boxed{5}")))
    return outs


def _legacy_batch(tok, reward_path, outs):
    """verl's AgentLoopWorker._postprocess of the outputs: the legacy trainer's padded batch with flat columns."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    config = make_config(reward_path)
    fake = types.SimpleNamespace(rollout_config=config.actor_rollout_ref.rollout, tokenizer=tok, processor=None,
                                 mm_processor_kwargs={}, reward_loop_worker_handles=None, distillation_enabled=False)
    for name in ("_pad_token_ids", "_compute_multi_modal_inputs", "_compute_position_ids", "_compute_score",
                 "_compute_teacher_logprobs", "_get_mm_processor_kwargs", "_agent_loop_postprocess", "_postprocess"):
        setattr(fake, name, types.MethodType(getattr(AgentLoopWorker, name), fake))

    async def go():
        return fake._postprocess([await fake._agent_loop_postprocess(o, False, **sample()) for o in outs])

    return asyncio.run(go())


def _decode(tok):
    return lambda x: tok.decode(x, skip_special_tokens=True)


def _batch_decode(tok):
    return lambda pieces: tok.batch_decode(pieces, skip_special_tokens=True)


def test_dump_columns_legacy_and_v1(tok, reward_path, verl_loop):
    cfg = GecConfig()
    outs = _outputs(tok, reward_path)
    data = _legacy_batch(tok, reward_path, outs)
    legacy = gec_dump_columns(data.non_tensor_batch, data.batch["responses"], ["g"] * 4, ["toy"] * 4,
                              _batch_decode(tok))
    v1 = gec_dump_columns({"extra_fields": [o.extra_fields for o in outs]}, [o.response_ids for o in outs],
                          ["g"] * 4, ["toy"] * 4, _batch_decode(tok))
    assert legacy == v1
    assert v1["gec_branch"] == ["reflect", "answer", "solution", "none"]
    assert v1["gec_score_before"] == [0.0, 0.0, 0.0, 1.0] and v1["gec_correct_before"] == [False] * 3 + [True]
    assert v1["gec_first_response"] == [FIRST_WRONG] * 3 + ["The sum is \\boxed{5}"]
    texts = [{s["kind"]: s["text"] for s in segs} for segs in v1["gec_segments"]]
    assert texts[0] == {"policy": FIRST_WRONG, "cue": cfg.cue, "continuation": CONTINUATION}
    assert texts[1] == {"policy": FIRST_WRONG, "answer": cfg.answer_template.replace("{answer}", "5"), "eos": ""}
    assert texts[2] == {"solution": SOLUTION, "eos": ""}
    for out, segs in zip(outs, v1["gec_segments"]):  # the pieces make up the final response
        assert "".join(s["text"] for s in segs) == _decode(tok)(out.response_ids)
        assert sum(s["tokens"] for s in segs) == len(out.response_ids)
    assert v1["gec_group"] == ["g"] * 4 and v1["data_source"] == ["toy"] * 4
    # rows of another agent loop (no GEC fields): no columns, or empty cells
    assert gec_dump_columns({"extra_fields": [{}]}, [[1, 2]], ["g"], None, _batch_decode(tok)) is None
    mixed = gec_dump_columns({"extra_fields": [outs[0].extra_fields, {}]}, [outs[0].response_ids, [1]], ["g", "h"],
                             None, _batch_decode(tok))
    assert mixed["gec_branch"] == ["reflect", None] and mixed["gec_segments"][1] is None


@pytest.mark.parametrize("trainer", ["legacy", "v1"])
def test_samples_page_from_verls_dump(tok, reward_path, verl_loop, tmp_path, trainer):
    """verl's own _write_generations writes the lines (its columns plus ours); report --samples renders them."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verl_ext.report import main as report_main

    write = (RayPPOTrainer if trainer == "legacy" else PPOTrainer)._write_generations
    cfg = GecConfig()
    outs = _outputs(tok, reward_path)
    long_first = "x" * 5000  # a long response: cut on the page, with a marker
    columns = gec_dump_columns({"extra_fields": [o.extra_fields for o in outs]}, [o.response_ids for o in outs],
                               ["g"] * 4, ["toy"] * 4, _batch_decode(tok))
    columns["gec_first_response"][0] = long_first
    columns["gec_first_response"][2] = ""  # a policy that ended its response at once (the solution replaced it)
    finals = [_decode(tok)(o.response_ids) for o in outs]
    dump = tmp_path / "run" / "rollouts"
    for step in (1, 2):
        write(["What is 2+3?"] * 4, finals, ["5"] * 4, [1.0, 1.0, 1.0, 1.0] if step == 1 else [1.0, 1.0, 0.0, 1.0],
              columns, str(dump), step)
    line = json.loads((dump / "1.jsonl").read_text().splitlines()[0])
    assert line["output"] == finals[0] and line["gec_branch"] == "reflect" and line["gec_score_before"] == 0.0
    assert line["gec_first_response"] == long_first and line["gec_segments"][1] == {
        "kind": "cue", "text": cfg.cue, "tokens": len(ids(tok, cfg.cue))}

    assert report_main([str(tmp_path / "run"), "--samples", "--steps", "2", "-o", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "samples.html").read_text()
    assert 'class="seg seg-cue"' in page and f">{cfg.cue}</span>" in page
    assert f'seg-continuation" title="continuation (policy) · {len(ids(tok, CONTINUATION)) + 1} tokens">' in page
    assert "seg-solution" in page and "seg-answer" in page and "⟨eos⟩" in page
    assert "characters cut (full text below)" in page and long_first in page  # cut, the whole text one click away
    assert "(empty: the policy ended its response at once)" in page
    assert "step 2 · group" in page and "step 1 · group" not in page  # only the chosen step
    assert "group before [<b>0</b> 0 0 1]" in page and "group after&nbsp; [<b>1</b> 1 0 1]" in page
    assert "branch: reflect" in page and "branch: none" in page and "data source toy" in page
    with pytest.raises(SystemExit):  # a step that was not dumped
        report_main([str(tmp_path / "run"), "--samples", "--steps", "7", "-o", str(tmp_path / "out")])
    with pytest.raises(SystemExit):  # no dump
        report_main([str(tmp_path / "out"), "--samples"])


def test_chosen_steps():
    from verl_ext.report_samples import choose_steps

    assert choose_steps(list(range(1, 11))) == [1, 5, 10]  # first, middle, last
    assert choose_steps([3, 1]) == [1, 3] and choose_steps([2, 4, 6], [6, 2]) == [2, 6]
    with pytest.raises(ValueError, match="not in the dump"):
        choose_steps([1, 2], [3])

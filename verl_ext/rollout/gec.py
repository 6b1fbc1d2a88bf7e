"""Guided Error Correction (EDGE-GRPO) and the +Force-R baseline (docs/edge-grpo.md): the pure logic.

No ray / verl imports here: the agent loop (``verl_ext.rollout.gec_agent_loop``) does the I/O (generation,
reward, tokenizer) and calls these functions; the trainer side reads the per-sample fields written here
(:data:`EXTRA_KEYS`) in ``verl_ext.trainer.gec_metrics``.

What the official code does and what this port keeps (docs/edge-grpo.md):
  * every response whose reward is below ``correct_threshold`` is edited, correct ones are left alone, the
    group keeps its n members;
  * mode ``gec``: one branch per wrong response, drawn with p_reflect / p_answer / p_solution;
    mode ``force_reflect``: always the reflection branch (cue + policy continuation, no ground truth);
  * the whole correction is skipped when the prompt has ``>= prompt_length_gate`` tokens (branch ``gated``);
  * opt-in, not in the paper (``edit_scope=all_wrong_groups``): only groups whose first attempts are all wrong are
    edited, a wrong response of any other group is left as it is (branch ``group_not_all_wrong``);
  * opt-in, not in the paper (``min_own_tokens`` > 0): a wrong response with fewer than that many tokens of its
    own is left uncorrected (branch ``too_short``), so an immediately-ended reply cannot be turned into a correct
    one and GRPO penalises it (docs/toy.md, "the degenerate-edit guard").
Length budget (the original samples at most 1024 tokens, then continues reflections for 256): on a GEC training
rollout the first generation is capped by :func:`first_generation_budget` so that every branch that can be drawn
has room after it; an answer template that still would not fit is not cut but skipped (``answer_no_room``), and
a reference solution longer than the response budget falls back to the answer (``solution_too_long``).
Deviations, on purpose (docs/edge-grpo.md): the new response is built by concatenating token ids (no decode/re-encode),
so the prompt/response boundary is exact and the response keeps an EOS: the original response's own
terminator (or the tokenizer's EOS when it had none) closes the answer and solution branches; a reflection
continuation keeps exactly what the policy generated (EOS included iff the policy stopped by itself -- a
continuation cut by a token budget gets no invented EOS, like any length-truncated verl response).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verl_ext.names import TRAINING_ROLLOUT_KEY

# ---------------------------------------------------------------- branches and per-sample fields

BRANCH_NONE = "none"  # correct before correction (or GEC had nothing to do)
BRANCH_REFLECT = "reflect"  # cue + policy continuation (also every edit of mode force_reflect)
BRANCH_ANSWER = "answer"  # answer template with the ground truth appended
BRANCH_SOLUTION = "solution"  # response replaced by the reference solution
BRANCH_SOLUTION_FALLBACK = "solution_fallback"  # solution drawn, row has none: answer injection instead
BRANCH_SOLUTION_TOO_LONG = "solution_too_long"  # solution drawn, longer than the response budget: answer instead
BRANCH_GATED = "gated"  # wrong, but the prompt-length gate skipped the correction
BRANCH_ANSWER_NO_ROOM = "answer_no_room"  # answer injection drawn, template + EOS would not fit: left unedited
BRANCH_TOO_SHORT = "too_short"  # wrong with fewer than min_own_tokens tokens of its own: left unedited (the guard)
BRANCH_NO_GROUND_TRUTH = "no_ground_truth"  # answer injection drawn, the row has no ground truth: left unedited
# wrong, but another first attempt of its group is right (edit_scope=all_wrong_groups): left unedited, plain GRPO
BRANCH_GROUP_NOT_ALL_WRONG = "group_not_all_wrong"
BRANCHES = (BRANCH_NONE, BRANCH_REFLECT, BRANCH_ANSWER, BRANCH_SOLUTION, BRANCH_SOLUTION_FALLBACK,
            BRANCH_SOLUTION_TOO_LONG, BRANCH_GATED, BRANCH_ANSWER_NO_ROOM, BRANCH_TOO_SHORT, BRANCH_NO_GROUND_TRUTH,
            BRANCH_GROUP_NOT_ALL_WRONG)
EDIT_BRANCHES = (BRANCH_REFLECT, BRANCH_ANSWER, BRANCH_SOLUTION, BRANCH_SOLUTION_FALLBACK, BRANCH_SOLUTION_TOO_LONG)
ANSWER_BRANCHES = (BRANCH_ANSWER, BRANCH_SOLUTION_FALLBACK, BRANCH_SOLUTION_TOO_LONG)  # inject the answer template

# Keys the agent loop writes into AgentLoopOutput.extra_fields (non-tensor columns of the trainer batch).
KEY_BRANCH = "gec_branch"  # str, one of BRANCHES
KEY_SCORE_BEFORE = "gec_score_before"  # float, reward of the first response
KEY_CORRECT_BEFORE = "gec_correct_before"  # bool, see response_is_correct
KEY_CONTINUATION_TOKENS = "gec_continuation_tokens"  # int, policy tokens generated after the cue (kept)
KEY_INJECTED_TOKENS = "gec_injected_tokens"  # int, cue/template/solution/EOS tokens in the final response
KEY_TRUNCATED = "gec_truncated"  # bool, the edit was cut by rollout.response_length
KEY_RESPONSE_LEN_BEFORE = "gec_response_len_before"  # int, tokens of the first response
KEY_FIRST_HIT_CAP = "gec_first_hit_cap"  # bool, the first generation stopped at first_generation_budget, no EOS
KEY_SPANS = "gec_spans"  # list of [kind, start, end]: the final response's pieces (SPAN_KINDS), token positions
# str, what GEC could not do with this row's data ("" when nothing): a row without ground truth that drew the answer
# branch, unknown extra_info.sampling_params keys; counted in gec/errors, past algorithm.gec.max_error_frac the
# driver stops the run (trainer/gec_metrics.check_gec_errors)
KEY_ERROR = "gec_error"
EXTRA_KEYS = (
    KEY_BRANCH,
    KEY_SCORE_BEFORE,
    KEY_CORRECT_BEFORE,
    KEY_CONTINUATION_TOKENS,
    KEY_INJECTED_TOKENS,
    KEY_TRUNCATED,
    KEY_RESPONSE_LEN_BEFORE,
    KEY_FIRST_HIT_CAP,
    KEY_SPANS,
    KEY_ERROR,
)
# Only while verl's rollout dump is on (trainer.rollout_data_dir): the first response's token ids, written where the
# final response does not start with them (the solution branches replace the whole response).
KEY_FIRST_RESPONSE_IDS = "gec_first_response_ids"

# Pieces of a final response (KEY_SPANS): the policy's own first response (its kept core), the injected cue,
# answer template, reference solution or EOS, and the policy's continuation after the cue.
SPAN_POLICY = "policy"
SPAN_CUE = "cue"
SPAN_CONTINUATION = "continuation"
SPAN_ANSWER = "answer"
SPAN_SOLUTION = "solution"
SPAN_EOS = "eos"
SPAN_KINDS = (SPAN_POLICY, SPAN_CUE, SPAN_CONTINUATION, SPAN_ANSWER, SPAN_SOLUTION, SPAN_EOS)
# the pieces a rollout engine sampled (they carry its log-probs); every other piece was injected by GEC
SAMPLED_SPAN_KINDS = (SPAN_POLICY, SPAN_CONTINUATION)


# ---------------------------------------------------------------- branch choice


def sample_rng(seed: int, *key_parts: Any) -> random.Random:
    """A ``random.Random`` seeded from ``seed`` and a per-sample key (uid, session, step, ...).

    String seeding is deterministic across processes (unlike ``hash``), so a sample's draw does not depend on
    which worker runs it or on scheduling order.
    """
    return random.Random("gec|" + "|".join(str(p) for p in (seed, *key_parts)))


def draw_branch(cfg, rng: random.Random) -> str:
    """One draw among reflect / answer / solution with cfg's probabilities (force_reflect: always reflect)."""
    if cfg.mode == "force_reflect":
        return BRANCH_REFLECT
    u = rng.random()
    if u < cfg.p_reflect:
        return BRANCH_REFLECT
    if u < cfg.p_reflect + cfg.p_answer:
        return BRANCH_ANSWER
    if cfg.p_solution > 0:
        return BRANCH_SOLUTION
    # p_solution == 0 and rounding left u above p_reflect + p_answer (sums to 1 within 1e-6)
    return BRANCH_ANSWER if cfg.p_answer > 0 else BRANCH_REFLECT


def acc_is_correct(acc: Any) -> bool | None:
    """A reward's ``acc`` as right/wrong: fully correct (True or >= 1) or not; None when it is not a number."""
    try:
        value = float(acc.item() if hasattr(acc, "item") else acc)
    except (TypeError, ValueError):
        return None
    return bool(np.isfinite(value) and value >= 1.0 - 1e-6)


def reward_acc(reward_extra_info: Any) -> bool | None:
    """Correctness from the ``acc`` of a reward function that returned a dict, else None.

    verl's reward managers copy a dict result's keys (``score`` included) into ``reward_extra_info`` and, for a
    plain float result, set ``acc`` to the score itself; so ``acc`` is the reward's own accuracy only when ``score``
    sits next to it.
    """
    if not isinstance(reward_extra_info, dict) or "acc" not in reward_extra_info or "score" not in reward_extra_info:
        return None
    return acc_is_correct(reward_extra_info["acc"])


def response_is_correct(cfg, score: float, reward_extra_info: Any = None) -> bool:
    """Right or wrong before correction: the reward's ``acc`` when it returns one, else score >= correct_threshold.

    ``acc`` keeps GEC working with rewards whose scale no threshold separates, e.g. EDGE-GRPO's 1 + accuracy
    (every response scores >= 1); as in the original, anything short of full accuracy counts as wrong.
    """
    from_acc = reward_acc(reward_extra_info)
    if from_acc is not None:
        return from_acc
    return float(score) >= float(cfg.correct_threshold)


def is_gated(cfg, prompt_len: int) -> bool:
    gate = cfg.prompt_length_gate
    return gate is not None and int(prompt_len) >= int(gate)


def is_too_short(cfg, own_tokens: int | None) -> bool:
    """The degenerate-edit guard: a wrong response with fewer than ``cfg.min_own_tokens`` tokens of its own (its
    core: the response without the trailing EOS/padding) is not corrected. Off when ``min_own_tokens`` is 0."""
    k = int(getattr(cfg, "min_own_tokens", 0) or 0)
    return k > 0 and own_tokens is not None and int(own_tokens) < k


def choose_branch(cfg, *, correct: bool, prompt_len: int, has_solution: bool, rng: random.Random,
                  solution_fits: bool = True, own_tokens: int | None = None, group_all_wrong: bool = True) -> str:
    """The branch of one response: none (correct), gated, group_not_all_wrong, too_short, or an edit (BRANCHES).

    The gate and the guard are checked only for wrong responses (correct ones are ``none`` whatever their prompt
    length), and no random number is drawn for correct, gated, out-of-scope or too-short responses. ``own_tokens``:
    the response's own tokens without its trailing EOS (:func:`split_terminal`), for the guard (``min_own_tokens``).
    ``group_all_wrong``: whether every first attempt of the response's group is wrong (read with
    ``edit_scope=all_wrong_groups``, which edits only such groups). A drawn solution falls back to the answer when
    the row has none (``solution_fallback``) or when it does not fit the response budget (``solution_too_long``).
    """
    if correct:
        return BRANCH_NONE
    if is_gated(cfg, prompt_len):
        return BRANCH_GATED
    if getattr(cfg, "edit_scope", "all") == "all_wrong_groups" and not group_all_wrong:
        return BRANCH_GROUP_NOT_ALL_WRONG
    if is_too_short(cfg, own_tokens):
        return BRANCH_TOO_SHORT
    branch = draw_branch(cfg, rng)
    if branch == BRANCH_SOLUTION and not has_solution:
        return BRANCH_SOLUTION_FALLBACK
    if branch == BRANCH_SOLUTION and not solution_fits:
        return BRANCH_SOLUTION_TOO_LONG
    return branch


def first_generation_budget(cfg, response_length: int, *, cue_tokens: int, answer_tokens: int | None,
                            solution_fits: bool = True) -> int:
    """Most tokens the first generation of a GEC training rollout may take, so that each drawable branch fits.

    Room is kept for the larger of: cue + ``max_continuation_tokens`` (reflection can be drawn) and answer
    template + EOS (answer injection can be drawn: ``p_answer > 0``, or ``p_solution > 0`` with no usable
    solution). ``answer_tokens`` None means unknown (the row has no ground truth) and reserves nothing for it.
    With ``response_length = 1024 + cue + 256`` this is the original's 1024 + 256. At least 1.
    Mode ``hint`` edits nothing after the first generation (a hinted sample is a generation of its own): all of
    ``response_length``.
    """
    if cfg.mode == "hint":
        return max(1, int(response_length))
    reserve = 0
    if cfg.mode == "force_reflect" or cfg.p_reflect > 0:
        reserve = int(cue_tokens) + int(cfg.max_continuation_tokens)
    answer_drawable = cfg.mode != "force_reflect" and (cfg.p_answer > 0 or (cfg.p_solution > 0 and not solution_fits))
    if answer_drawable and answer_tokens is not None:
        reserve = max(reserve, int(answer_tokens) + 1)
    return max(1, int(response_length) - reserve)


def reference_solution(extra_info: Any, key: str) -> str | None:
    """``extra_info[key]`` when it is a non-blank string, else None (the row has no reference solution)."""
    if not isinstance(extra_info, dict):
        return None
    value = extra_info.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    return value if value.strip() else None


def ground_truth_text(reward_model: Any) -> str:
    """The ground-truth answer as text: ``reward_model["ground_truth"]`` (first element of a list).

    Raises ValueError when there is none: missing, None, an empty list, or an empty or blank string (GEC would
    inject an empty answer); the start-up data check refuses such rows in local files already.
    """
    gt = reward_model.get("ground_truth") if isinstance(reward_model, dict) else reward_model
    if isinstance(gt, np.ndarray):
        gt = gt.tolist()
    if isinstance(gt, (list, tuple)):
        gt = gt[0] if len(gt) else None
    if gt is None or not str(gt).strip():
        raise ValueError(f"GEC answer injection needs reward_model.ground_truth, the row has none ({gt!r})")
    return str(gt)


def answer_text(cfg, answer: str) -> str:
    return cfg.answer_template.replace("{answer}", answer)


# ---------------------------------------------------------------- token-level assembly


def split_terminal(ids: Sequence[int], stop_ids: Iterable[int]) -> tuple[list[int], int | None]:
    """Split trailing stop/padding tokens off a response: ``(core, terminator)``.

    ``terminator`` is the first stripped token (the EOS the policy emitted), or None when the response did not
    end with one (length-truncated).
    """
    stop = {int(i) for i in stop_ids}
    ids = [int(i) for i in ids]
    end = len(ids)
    while end > 0 and ids[end - 1] in stop:
        end -= 1
    return ids[:end], (ids[end] if end < len(ids) else None)


def continuation_budget(response_length: int, used: int, max_continuation_tokens: int) -> int:
    """Tokens the policy may add after ``used`` response tokens: ``min(max_continuation_tokens, room)``, >= 0."""
    return max(0, min(int(max_continuation_tokens), int(response_length) - int(used)))


@dataclass
class Segment:
    """A piece of the new response. ``injected`` pieces (cue, template, solution, added EOS) are not the policy's."""

    ids: list[int]
    injected: bool
    mask: list[int] | None = None  # policy pieces: their original response_mask values (default all 1)
    logprobs: list[float] | None = None  # policy pieces: rollout log-probs (padded with 0.0 if short)
    kind: str = ""  # one of SPAN_KINDS (for KEY_SPANS); "" -> policy or, for injected pieces, "injected"


@dataclass
class AssembledResponse:
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    truncated: bool  # tokens were cut to fit response_length
    injected_tokens: int  # injected tokens kept after truncation
    policy_prefix_tokens: int  # leading tokens that are the first response's own (for routed experts)
    segment_lengths: list[int] = field(default_factory=list)  # kept tokens per segment
    spans: list[list] = field(default_factory=list)  # [kind, start, end] per non-empty kept segment (KEY_SPANS)


def assemble_response(
    segments: Sequence[Segment],
    *,
    response_length: int,
    mask_injected: bool,
    with_logprobs: bool,
    injected_logprob: float = 0.0,
) -> AssembledResponse:
    """Concatenate segments into response ids / mask / rollout log-probs of equal length, cut to response_length.

    Injected tokens get mask 1 (trained as policy tokens, like the original) or 0 with ``mask_injected``, and
    rollout log-prob ``injected_logprob`` (0.0: the rollout engine never sampled them, verl has no log-prob for
    them; the actor's recomputed old log-probs are what the loss uses).
    """
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    for seg in segments:
        n = len(seg.ids)
        ids.extend(int(t) for t in seg.ids)
        if seg.injected:
            mask.extend([0 if mask_injected else 1] * n)
            lps.extend([float(injected_logprob)] * n)
        else:
            m = list(seg.mask) if seg.mask is not None else [1] * n
            m = (m + [1] * n)[:n]
            mask.extend(int(x) for x in m)
            lp = list(seg.logprobs) if seg.logprobs is not None else []
            lp = (lp + [float(injected_logprob)] * n)[:n]
            lps.extend(float(x) for x in lp)
    total = len(ids)
    limit = int(response_length)
    truncated = total > limit
    kept_lengths, left = [], limit
    for seg in segments:
        k = min(len(seg.ids), max(left, 0))
        kept_lengths.append(k)
        left -= k
    injected = sum(k for seg, k in zip(segments, kept_lengths) if seg.injected)
    # only a policy first segment (the first response's kept core) lines up with the first generation
    prefix = kept_lengths[0] if segments and not segments[0].injected else 0
    return AssembledResponse(
        response_ids=ids[:limit],
        response_mask=mask[:limit],
        response_logprobs=lps[:limit] if with_logprobs else None,
        truncated=truncated,
        injected_tokens=injected,
        policy_prefix_tokens=prefix,
        segment_lengths=kept_lengths,
        spans=response_spans(segments, kept_lengths),
    )


def response_spans(segments: Sequence[Segment], kept_lengths: Sequence[int]) -> list[list]:
    """Where each segment lies in the assembled response.

    Args:
        segments: the pieces, in order (their ``kind`` names the span; unnamed: ``policy`` / ``injected``).
        kept_lengths: tokens kept of each segment after the cut to response_length.

    Returns:
        ``[kind, start, end]`` (half-open token positions) per segment with at least one kept token.
    """
    spans, start = [], 0
    for seg, k in zip(segments, kept_lengths):
        if k > 0:
            kind = seg.kind or ("injected" if seg.injected else SPAN_POLICY)
            spans.append([kind, start, start + int(k)])
        start += int(k)
    return spans


def injected_token_mask(spans_rows: Sequence, shape: tuple[int, int]) -> np.ndarray:
    """Where GEC injected tokens, in a batch of final responses.

    Args:
        spans_rows: per row, its ``[kind, start, end]`` pieces (``KEY_SPANS``); None or empty: a row GEC did not
            write (another agent loop, GEC off), which has no injected token.
        shape: (B, T), the batch's response tensor.

    Returns:
        (B, T) bool: True at the tokens of every piece but the policy's own (``SAMPLED_SPAN_KINDS``).
    """
    mask = np.zeros(shape, dtype=bool)
    for i, spans in enumerate(spans_rows):
        for kind, start, end in spans if spans is not None else ():
            if kind not in SAMPLED_SPAN_KINDS:
                mask[i, int(start):int(end)] = True
    return mask


# ---------------------------------------------------------------- training or validation rollout


def is_training_rollout(row: dict) -> bool:
    """Whether verl_ext's trainer tagged this row as a training rollout (``names.TRAINING_ROLLOUT_KEY``).

    The agent loop receives the row's columns as keyword arguments; an untagged row (verl_ext's trainers tag every
    row while GEC is on) counts as not training, so ground truth is never injected into an evaluation.
    """
    value = row.get(TRAINING_ROLLOUT_KEY)
    if hasattr(value, "item"):  # numpy / torch scalar
        value = value.item()
    return value is True

"""Prompt-side hints (``algorithm.gec.mode=hint``, docs/hints.md): the pure logic (stdlib only).

A training group whose first attempts are all wrong gets a prefix of its row's reference solution
(``extra_info[solution_key]``) before the policy writes, at rising levels (``hint_levels``, fractions of the
solution's steps); the policy's own tokens sampled after the hint are what is trained, against the hinted prompt.
This module holds what the ``gec_agent`` loop decides and builds, with no I/O (no tokenizer, server or reward):

* **the cut rule** (:func:`hint_text`): where a solution may be cut (its step ends, a function of the task,
  registered by name like a reward: :data:`HINT_RULES`, :func:`register_hint_rule`; ``algorithm.gec.hint_rule``
  names the one a run uses), and which step end a fraction picks (:func:`steps_for_fraction`);
* **the hinted prompt** for each placement (:func:`assistant_prefix_prompt_ids`, :func:`user_hint_messages`);
* **a row's usable levels** and why a row gets none (:func:`plan_row_hints`; the skip causes :data:`SKIP_CAUSES`,
  counted, never a silent cut);
* **the decisions**: whether hints are due at a step (:func:`hints_due`), which member of an all-wrong group
  samples with hints (:func:`samples_with_hints`), which level comes next (:func:`next_hint_level`), what the
  group ends with (:func:`final_hint_level`);
* **the step's metrics** from the per-sample fields the loop writes (:func:`hint_step_metrics`).

Integration in the ``gec_agent`` loop (``GecAgentLoop._hint`` in ``rollout/gec_agent_loop.py``):

1. Trigger: a *training* row (``gec.is_training_rollout``: validation rows are never hinted) at a step with
   :func:`hints_due` (``global_steps`` > ``hint_warmup_steps``; verl counts steps from 1) takes its seat in the group
   barrier that ``edit_scope=all_wrong_groups`` uses (``GroupFirstAttempts``, keyed by uid and step) whatever
   ``edit_scope`` says; its first generation gets the whole ``data.max_response_length`` (no edit room:
   ``gec.first_generation_budget`` returns it for mode ``hint``), is scored with verl's reward manager as GEC scores
   it, and reports right/wrong. A group with a right first attempt returns as sampled (plain GRPO).
2. An all-wrong group builds its levels once per sample with :func:`plan_row_hints` (the same row, so every member
   agrees): ``hinted_prompt_ids`` is ``assistant_prefix_prompt_ids(prompt_ids, encode(hint))`` for
   ``assistant_prefix`` (the chat-templated prompt with its generation prompt, then the hint's ids: the assistant
   turn starts with the hint) or the chat template of ``user_hint_messages(raw_prompt, hint_template, hint)`` for
   ``user``; ``max_prompt_length`` is ``data.max_prompt_length``. A skipped row returns its first attempts as
   sampled, its cause in ``hint_skip``.
3. Scope ``one``: the member that :func:`samples_with_hints` picks (seat 0, the first of the group to start in the
   worker) generates one sample per level, lowest first (:func:`next_hint_level`), each scored; the first right
   one replaces its own first attempt; none right: it returns its first attempt. Every other member returns as
   sampled. Scope ``all``: every member generates at the level, reports right/wrong to the barrier under a key of its
   own per level ((uid, step, "hint", level)), and goes on to the next level while the whole group is wrong; the
   group ends all hinted, at the last level it tried (:func:`final_hint_level`).
4. A hinted output is the row verl builds had the policy been given the hinted prompt: ``prompt_ids`` = the hinted
   prompt (so the hint sits outside ``response_mask``), ``response_ids`` / ``response_mask`` /
   ``response_logprobs`` = the hinted generation's own (sampled tokens, real rollout log-probs: verl's
   rollout-vs-actor diagnostics and ``rollout_correction`` read them as they read any sampled token), reward
   scored by verl's reward loop on that response (the hint never holds the final answer: the cut rules stop before
   it). verl left-pads prompts to ``data.max_prompt_length``, hence the skip of hints that would not fit.
5. Per-sample fields (``KEY_*`` below; every training row of a hint run carries all of them, as verl's
   ``DataProto.concat`` needs the same columns in every chunk), folded by :func:`hint_step_metrics` on the driver:
   groups hinted, samples and accuracy per level, replaced members, skipped groups by cause. Every row also carries
   GEC's fields (``gec.EXTRA_KEYS``) as for a response GEC leaves as sampled: the first attempt's score and
   correctness, and ``gec_spans`` marking the final response all policy tokens (verl_ext's rollout diagnostics read
   the hinted tokens as sampled ones).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.names import GEC_HINT_SCOPES, HINT_PLACEHOLDER, HINT_RULE_MATH, HINT_RULE_TOY

# ---------------------------------------------------------------- cut rules (a function of the task)

# A cut rule: the solution text -> the character positions where a hint may end (its step ends), increasing, each
# leaving a non-blank hint and none reaching into the final answer.
StepEnds = Callable[[str], list[int]]
HINT_RULES: dict[str, StepEnds] = {}


def register_hint_rule(name: str) -> Callable[[StepEnds], StepEnds]:
    """Register a cut rule under ``name`` (``algorithm.gec.hint_rule``), as a decorator.

    Args:
        name: the rule's name; registering another function under a taken name is an error.

    Returns:
        The decorator, which returns the function unchanged.
    """

    def decorate(fn: StepEnds) -> StepEnds:
        if HINT_RULES.get(name, fn) is not fn:
            raise ValueError(f"hint rule {name!r} is registered already ({HINT_RULES[name].__qualname__})")
        HINT_RULES[name] = fn
        return fn

    return decorate


def hint_rule(name: str) -> StepEnds:
    """The registered cut rule ``name``; ValueError naming the registered ones when there is none."""
    if name not in HINT_RULES:
        raise ValueError(f"no hint rule {name!r}; registered: {sorted(HINT_RULES)}")
    return HINT_RULES[name]


# the toy's step: a running total (``3+5=8`` then ``+5=13``); its final answer follows the last ``#``
_TOY_TOTAL = re.compile(r"=\d+")
TOY_ANSWER_MARK = "#"


@register_hint_rule(HINT_RULE_TOY)
def toy_step_ends(solution: str) -> list[int]:
    """Step ends of a toy solution (``verl_ext/toy/reason.py``): right after each running total before the answer.

    ``3+5=8+5=13+7=20+2=22#22`` -> after ``=8``, ``=13``, ``=20``, ``=22`` (the whole chain but ``#22``).

    Args:
        solution: the reference solution (totals, then ``#`` and the final answer).

    Returns:
        The character positions after each running total that ends before the last ``#``; without a ``#``, every
        total but the last (the last total is then the answer). Empty for a solution without steps (the first
        toy's, which is the answer alone).
    """
    ends = [m.end() for m in _TOY_TOTAL.finditer(solution)]
    mark = solution.rfind(TOY_ANSWER_MARK)
    return [e for e in ends if e <= mark] if mark >= 0 else ends[:-1]


# Math that no step end may cut: display math ($$..$$, \[..\], \begin{env}..\end{env}), inline math (\(..\), $..$)
_MATH_SPAN = re.compile(
    r"\$\$.*?\$\$|\\\[.*?\\\]|\\begin\{(?P<env>[^}]*)\}.*?\\end\{(?P=env)\}|\\\(.*?\\\)|(?<!\\)\$(?:\\.|[^$\\])+\$",
    re.S,
)
# a sentence end inside a line: . ! or ? then spaces and a character that is not a lower-case letter (so "e.g. the"
# and "i.e. x" do not end a sentence)
_SENTENCE_END = re.compile(r"[.!?](?=[ \t]+[^\sa-z])")
_BOXED = re.compile(r"\\boxed|\\fbox")


def _protected_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _MATH_SPAN.finditer(text)]


@register_hint_rule(HINT_RULE_MATH)
def math_step_ends(solution: str) -> list[int]:
    """Step ends of a boxed-math solution (MATH, DeepScaleR): line ends, and sentence ends within a line.

    A line is a step, and a line of several sentences is several steps: prose solutions often hold a paragraph on
    one line, which line ends alone would make one step. No step ends inside math (display or inline), so a hint
    never opens ``\\[`` or ``\\begin{align}`` without closing it. A step end is the end of the step's text (trailing
    spaces and newlines are left to the policy).

    Args:
        solution: the reference solution text.

    Returns:
        Increasing character positions, each leaving a non-blank hint: the step ends before the last ``\\boxed``
        (or ``\\fbox``); without one, every step end but the last (the last step holds the answer).
    """
    ends: set[int] = set()
    start = 0
    for line in solution.splitlines(keepends=True):
        text = line.rstrip()
        if text.strip():
            ends.add(start + len(text))
            ends.update(start + m.end() for m in _SENTENCE_END.finditer(text))
        start += len(line)
    spans = _protected_spans(solution)
    kept = sorted(e for e in ends if solution[:e].strip() and not any(a < e < b for a, b in spans))
    boxed = [m.start() for m in _BOXED.finditer(solution)]
    if boxed:
        return [e for e in kept if e <= boxed[-1]]
    return kept[:-1]


# ---------------------------------------------------------------- which step end a fraction picks


def steps_for_fraction(fraction: float, n_steps: int) -> int:
    """How many of a solution's ``n_steps`` step ends a hint level keeps: the nearest whole number, half up, in
    [1, n_steps].

    Nearest, so each level's share of the steps is the closest to its fraction (floor would give 0.25 of 3 steps
    no hint at all and collapse levels; ceiling would give 0.75 of 2 steps everything but the answer); half up, so
    a tie gives the more helpful hint, and the same tie always rounds the same way (Python's ``round`` rounds
    2.5 to 2 and 3.5 to 4). At least 1 (a hint of no step is no hint); at most ``n_steps``, all the steps before the
    final answer, which the cut rules never include. Levels 0.25 / 0.5 / 0.75 of the toy's four-total chains keep
    1 / 2 / 3 totals.

    Args:
        fraction: the level, in (0, 1].
        n_steps: step ends of the solution (>= 1).

    Returns:
        k in [1, n_steps].
    """
    if n_steps < 1:
        raise ValueError(f"a hint needs a step end; the solution has {n_steps}")
    if not 0 < fraction <= 1:
        raise ValueError(f"hint level {fraction!r} is not in (0, 1]")
    k = math.floor(fraction * n_steps + 0.5 + 1e-9)  # 1e-9: 0.58 * 25 is 14.499999999999998 in floats
    return min(max(k, 1), n_steps)


def hint_text(solution: str, fraction: float, rule: str | StepEnds = HINT_RULE_MATH) -> str | None:
    """The hint of one level: the solution cut at its k-th step end (:func:`steps_for_fraction`).

    Args:
        solution: the reference solution.
        fraction: the level, in (0, 1].
        rule: a registered rule's name or a cut rule itself.

    Returns:
        ``solution[:end_k]``; None when the rule finds no step end (no hint can be cut from it).
    """
    ends = (hint_rule(rule) if isinstance(rule, str) else rule)(solution)
    if not ends:
        return None
    return solution[: ends[steps_for_fraction(fraction, len(ends)) - 1]]


def level_steps(fractions: Sequence[float], n_steps: int) -> list[tuple[int, int]]:
    """The distinct hints of a solution's levels: ``(level index, steps kept)``, the lowest level of each.

    Two levels that keep the same steps would give the same hint; only the lower one is kept, so "the next level"
    always shows more of the solution.

    Args:
        fractions: ``hint_levels`` (increasing, in (0, 1]).
        n_steps: step ends of the solution (>= 1).

    Returns:
        Increasing ``(index into fractions, k)`` pairs with distinct, increasing k.
    """
    out: list[tuple[int, int]] = []
    for index, fraction in enumerate(fractions):
        k = steps_for_fraction(fraction, n_steps)
        if not out or k > out[-1][1]:
            out.append((index, k))
    return out


# ---------------------------------------------------------------- the hinted prompt, per placement


def assistant_prefix_prompt_ids(prompt_ids: Sequence[int], hint_ids: Sequence[int]) -> list[int]:
    """``hint_placement=assistant_prefix``: the chat-templated prompt (generation prompt included) then the hint's
    token ids, so the assistant turn starts with the hint; the hint is prompt, never response.

    Args:
        prompt_ids: the row's prompt ids as verl's single-turn loop builds them.
        hint_ids: the hint's ids, tokenized alone (no special tokens).

    Returns:
        The hinted prompt's ids.
    """
    return [int(t) for t in prompt_ids] + [int(t) for t in hint_ids]


def user_hint_messages(messages: Sequence[dict], template: str, hint: str) -> list[dict]:
    """``hint_placement=user``: the chat messages with ``template`` (its ``{hint}`` replaced by the hint) appended to
    the last user message, to be chat-templated as the row's prompt is. The row's messages are not changed.

    Args:
        messages: the row's ``raw_prompt`` (role / content dicts; a content list gets a text part appended).
        template: ``hint_template``; its one placeholder ``{hint}`` is replaced (not ``str.format``: the template or
            the hint may hold LaTeX braces).
        hint: the hint text.

    Returns:
        A new list of messages.
    """
    out = [dict(m) for m in messages]
    users = [i for i, m in enumerate(out) if m.get("role") == "user"]
    if not users:
        raise ValueError("hint_placement=user needs a user message in the row's prompt; it has none")
    added = template.replace(HINT_PLACEHOLDER, hint)
    last = out[users[-1]]
    content = last.get("content")
    if isinstance(content, str):
        last["content"] = content + added
    elif isinstance(content, (list, tuple)):
        last["content"] = [*content, {"type": "text", "text": added}]
    else:
        raise ValueError(f"hint_placement=user: the last user message's content is {type(content).__name__}, "
                         "not text or a list of parts")
    return out


# ---------------------------------------------------------------- a row's levels, and why a row gets none

SKIP_NO_SOLUTION = "no_solution"  # the row has no reference solution (extra_info[solution_key])
SKIP_NO_STEP = "no_step"  # the cut rule finds no step end in it (e.g. the solution is the answer alone)
SKIP_PROMPT_TOO_LONG = "prompt_too_long"  # even the lowest level's hinted prompt exceeds data.max_prompt_length
SKIP_CAUSES = (SKIP_NO_SOLUTION, SKIP_NO_STEP, SKIP_PROMPT_TOO_LONG)


@dataclass
class HintLevel:
    """One usable hint of a row."""

    level: int  # index into hint_levels
    fraction: float
    steps: int  # step ends kept
    text: str
    prompt_ids: list[int]  # the hinted prompt


@dataclass
class RowHints:
    """A row's usable hints, lowest first, or why it has none."""

    levels: list[HintLevel] = field(default_factory=list)
    skip: str = ""  # one of SKIP_CAUSES when ``levels`` is empty, else ""
    too_long: int = 0  # levels left out because their hinted prompt exceeds max_prompt_length


def plan_row_hints(solution: str | None, *, fractions: Sequence[float], rule: str | StepEnds,
                   hinted_prompt_ids: Callable[[str], list[int]], max_prompt_length: int) -> RowHints:
    """The hints a row can get: its distinct levels (:func:`level_steps`) whose hinted prompt fits.

    A level whose hinted prompt is longer than ``max_prompt_length`` is left out and counted (``too_long``), never
    cut: a cut prompt would be a prompt nobody wrote.

    Args:
        solution: the row's reference solution (None: it has none).
        fractions: ``hint_levels``.
        rule: ``hint_rule`` (a name) or a cut rule.
        hinted_prompt_ids: the hinted prompt's ids for a hint text (the placement's builder).
        max_prompt_length: ``data.max_prompt_length``.

    Returns:
        The usable levels, lowest first, or none and the cause (:data:`SKIP_CAUSES`).
    """
    if solution is None or not solution.strip():
        return RowHints(skip=SKIP_NO_SOLUTION)
    ends = (hint_rule(rule) if isinstance(rule, str) else rule)(solution)
    if not ends:
        return RowHints(skip=SKIP_NO_STEP)
    plan = RowHints()
    for level, k in level_steps(fractions, len(ends)):
        text = solution[: ends[k - 1]]
        ids = list(hinted_prompt_ids(text))
        if len(ids) > int(max_prompt_length):
            plan.too_long += 1
            continue
        plan.levels.append(HintLevel(level, float(fractions[level]), k, text, ids))
    if not plan.levels:
        plan.skip = SKIP_PROMPT_TOO_LONG
    return plan


# ---------------------------------------------------------------- decisions


def hints_due(global_step: Any, warmup_steps: int) -> bool:
    """Whether a training step may hint: after ``hint_warmup_steps`` steps (verl counts steps from 1, so 0 hints
    from the first step and 50 leaves steps 1-50 unhinted, as Scaf-GRPO's ``global_steps > warmup_steps``).

    Args:
        global_step: the row's ``global_steps`` (None: unknown).
        warmup_steps: ``hint_warmup_steps``.

    Returns:
        True when hints are due; with a warm-up and no step, ValueError (a warm-up cannot be told).
    """
    if int(warmup_steps) == 0:
        return True
    if global_step is None:
        raise ValueError("algorithm.gec.hint_warmup_steps needs the row's global_steps, which verl did not pass")
    return int(global_step.item() if hasattr(global_step, "item") else global_step) > int(warmup_steps)


def samples_with_hints(scope: str, seat: int) -> bool:
    """Whether a member of an all-wrong group samples with hints.

    Args:
        scope: ``hint_scope``: ``one`` (Scaf-GRPO: one member) or ``all`` (GHPO: every member).
        seat: the member's seat in its group (0: the first to start).

    Returns:
        ``all``: True; ``one``: True for seat 0 only.
    """
    if scope not in GEC_HINT_SCOPES:
        raise ValueError(f"hint_scope {scope!r} is not one of {list(GEC_HINT_SCOPES)}")
    return scope == "all" or int(seat) == 0


def next_hint_level(n_levels: int, outcomes: Sequence[bool]) -> int | None:
    """The next level to sample, lowest first, given what the levels tried so far gave.

    The same rule for both scopes; what an outcome is differs: ``one``: the hinted sample at that level was right;
    ``all``: some member of the group was right at that level.

    Args:
        n_levels: the row's usable levels (``RowHints.levels``).
        outcomes: per level tried, in order, whether it succeeded.

    Returns:
        The index (into the usable levels) to sample next; None once a level succeeded or every level was tried.
    """
    if any(outcomes) or len(outcomes) >= n_levels:
        return None
    return len(outcomes)


def final_hint_level(scope: str, outcomes: Sequence[bool]) -> int | None:
    """The level a member's final response comes from, once :func:`next_hint_level` says stop.

    Args:
        scope: ``hint_scope``.
        outcomes: per level tried, whether it succeeded (as for :func:`next_hint_level`).

    Returns:
        ``one``: the level that succeeded (its sample replaces the member's first attempt), None when none did (the
        first attempt stays); ``all``: the last level tried (the group ends all hinted, right or not: GHPO keeps its
        last regeneration), None when none was tried.
    """
    if scope not in GEC_HINT_SCOPES:
        raise ValueError(f"hint_scope {scope!r} is not one of {list(GEC_HINT_SCOPES)}")
    if scope == "one":
        return next((i for i, ok in enumerate(outcomes) if ok), None)
    return len(outcomes) - 1 if outcomes else None


# ---------------------------------------------------------------- per-sample fields and the step's metrics

# Keys the loop writes into AgentLoopOutput.extra_fields of every training row of a hint run
KEY_HINT_LEVEL = "hint_level"  # int: index into hint_levels of the final response's hint; -1: unhinted
KEY_HINT_ATTEMPTS = "hint_attempts"  # list of [level, right]: every hinted sample this member drew, kept or not
KEY_HINT_SKIP = "hint_skip"  # str: why an all-wrong group got no hint (SKIP_CAUSES), "" otherwise
KEY_HINT_TOO_LONG = "hint_too_long"  # int: the row's levels left out for prompt length (RowHints.too_long)
HINT_EXTRA_KEYS = (KEY_HINT_LEVEL, KEY_HINT_ATTEMPTS, KEY_HINT_SKIP, KEY_HINT_TOO_LONG)


def hint_step_metrics(fields: Sequence[dict], groups: Sequence[Any], n_levels: int) -> dict[str, float]:
    """A step's hint metrics from its training rows' fields.

    Args:
        fields: per row, its ``HINT_EXTRA_KEYS`` values (a row without them counts as unhinted).
        groups: per row, its group (verl's ``uid``).
        n_levels: ``len(hint_levels)``.

    Returns:
        ``hint/groups_hinted`` (groups with a hinted sample), ``hint/replaced`` (rows whose final response is
        hinted), per level i ``hint/level{i}/samples`` and ``hint/level{i}/acc`` (every hinted sample drawn, kept or
        not; acc only where there were samples), ``hint/skipped/<cause>`` (groups, per :data:`SKIP_CAUSES`) and
        ``hint/levels_too_long`` (levels left out, summed over groups).
    """
    hinted, skipped, too_long = set(), {cause: set() for cause in SKIP_CAUSES}, {}
    samples, right = [0] * n_levels, [0] * n_levels
    replaced = 0
    for row, group in zip(fields, groups):
        attempts = row.get(KEY_HINT_ATTEMPTS) or []
        if attempts:
            hinted.add(group)
        for level, ok in attempts:
            samples[int(level)] += 1
            right[int(level)] += bool(ok)
        level = row.get(KEY_HINT_LEVEL)
        replaced += level is not None and int(level) >= 0
        cause = row.get(KEY_HINT_SKIP) or ""
        if cause:
            skipped.setdefault(cause, set()).add(group)
        too_long[group] = int(row.get(KEY_HINT_TOO_LONG) or 0)
    metrics = {"hint/groups_hinted": float(len(hinted)), "hint/replaced": float(replaced),
               "hint/levels_too_long": float(sum(too_long.values()))}
    for i in range(n_levels):
        metrics[f"hint/level{i}/samples"] = float(samples[i])
        if samples[i]:
            metrics[f"hint/level{i}/acc"] = right[i] / samples[i]
    metrics.update({f"hint/skipped/{cause}": float(len(g)) for cause, g in skipped.items()})
    return metrics

"""Prompt-side hints (``algorithm.gec.mode=hint``, verl_ext/rollout/hints.py): the cut rules on the toy's and on
boxed-math solutions, the hinted prompt per placement, a row's usable levels and skip causes, the scope decisions
and the step's metrics."""

from __future__ import annotations

import re

import pytest

from verl_ext.config import GecConfig
from verl_ext.names import HINT_RULE_MATH, HINT_RULE_TOY
from verl_ext.rollout import gec, hints
from verl_ext.toy import reason, task

LEVELS = (0.25, 0.5, 0.75)


@pytest.fixture(scope="module")
def tok():
    from verl_ext.toy.tokenizer import build_tokenizer

    return build_tokenizer()


# ---------------------------------------------------------------- the toy's cut rule


def test_the_toy_rule_cuts_after_running_totals_of_the_toys_own_solution():
    # the example: the third operand is where the hard split goes wrong
    solution = reason.solution(reason.DATA_SOURCE_CHAIN, (3, 5, 5, 7, 7))
    assert solution == "3+5=8+5=13+7=20+7=27#27"
    assert [hints.hint_text(solution, f, HINT_RULE_TOY) for f in (*LEVELS, 1.0)] == [
        "3+5=8", "3+5=8+5=13", "3+5=8+5=13+7=20", "3+5=8+5=13+7=20+7=27"]


@pytest.mark.parametrize("source", reason.DATA_SOURCES)
def test_the_toy_rule_on_every_family_of_the_split(source):
    split = reason.split_problems()
    rng = __import__("random").Random(0)
    for operands in split.train[source][:50] + split.val[source][:50]:
        order = reason.random_order(operands, rng) if source == reason.DATA_SOURCE_BAG else None
        solution = reason.solution(source, operands, order=order)
        ends = hints.toy_step_ends(solution)
        totals = re.findall(r"=(\d+)", solution.split("#")[0])
        assert len(ends) == len(totals) == len(operands) - 1  # one step per added digit
        for k, end in enumerate(ends, start=1):
            prefix = solution[:end]
            assert re.findall(r"=(\d+)", prefix) == totals[:k] and "#" not in prefix
            assert solution[end] in "+#"  # cut right after a whole running total
        whole = hints.hint_text(solution, 1.0, HINT_RULE_TOY)
        assert whole == solution.split("#")[0] and reason.final_answer(whole) == ""  # never the answer


def test_the_toy_rule_on_two_digit_terms_and_a_wrong_attempt():
    solution = reason.solution("toy_chain2d", (47, 8, 63))
    assert hints.toy_step_ends(solution) == [len("47+8=55"), len("47+8=55+63=118")]
    assert hints.hint_text(solution, 0.5, HINT_RULE_TOY) == "47+8=55"
    # a reply that corrected itself: only totals before the last "#" (the graded answer) are steps
    assert hints.toy_step_ends("3+4=8#8!3+4=7#7") == [len("3+4=8"), len("3+4=8#8!3+4=7")]
    assert hints.toy_step_ends("3+4=7+2=9") == [len("3+4=7")]  # without "#" the last total is the answer


def test_the_first_toys_solution_has_no_step():
    train, _ = task.make_rows()
    solution = train[0]["extra_info"]["solution"]
    assert solution.isdigit() and hints.toy_step_ends(solution) == []
    assert hints.hint_text(solution, 0.5, HINT_RULE_TOY) is None


# ---------------------------------------------------------------- the math cut rule

MULTILINE = (
    "Let the two numbers be $a$ and $b$.\n"
    "We know $a + b = 12$ and $a - b = 4$.\n"
    "\n"
    "Adding the equations gives\n"
    "\\[\n"
    "2a = 16.\n"
    "\\]\n"
    "So $a = 8$ and $b = 4$.\n"
    "Therefore the product is $ab = \\boxed{32}$.\n"
)
PARAGRAPH = (
    "First, note that $3.5 \\times 2 = 7$. Then the total is $7 + 5 = 12$, e.g. the sum of both parts. "
    "Dividing by $4$ gives $3$! Therefore the answer is $\\boxed{3}$."
)
ALIGN = (
    "We expand:\n"
    "\\begin{align*}\n"
    "(x+1)^2 &= x^2 + 2x + 1. \\\\\n"
    "&= 10.\n"
    "\\end{align*}\n"
    "Hence $x = 3$. The answer is \\boxed{3}."
)


def test_the_math_rule_cuts_at_line_ends_never_inside_display_math_nor_into_the_answer():
    cuts = [MULTILINE[:e] for e in hints.math_step_ends(MULTILINE)]
    assert [c.splitlines()[-1] for c in cuts] == [
        "Let the two numbers be $a$ and $b$.", "We know $a + b = 12$ and $a - b = 4$.", "Adding the equations gives",
        "\\]", "So $a = 8$ and $b = 4$."]
    assert all("boxed" not in c and not c.endswith("\n") for c in cuts)
    assert hints.hint_text(MULTILINE, 0.5, HINT_RULE_MATH) == cuts[2]  # 0.5 * 5 steps = 2.5 -> 3
    assert hints.hint_text(MULTILINE, 1.0, HINT_RULE_MATH) == cuts[-1]  # every step but the answer


def test_the_math_rule_cuts_a_paragraph_at_its_sentence_ends():
    cuts = [PARAGRAPH[:e] for e in hints.math_step_ends(PARAGRAPH)]
    # not at "3.5" (a decimal), not at "e.g." (a lower-case word follows), not in the sentence with the box
    assert cuts == ["First, note that $3.5 \\times 2 = 7$.",
                    "First, note that $3.5 \\times 2 = 7$. Then the total is $7 + 5 = 12$, e.g. the sum of both parts.",
                    "First, note that $3.5 \\times 2 = 7$. Then the total is $7 + 5 = 12$, e.g. the sum of both parts. "
                    "Dividing by $4$ gives $3$!"]


def test_the_math_rule_does_not_cut_an_environment_nor_inline_math():
    cuts = [ALIGN[:e] for e in hints.math_step_ends(ALIGN)]
    assert cuts == ["We expand:", ALIGN[:ALIGN.index("\\end{align*}") + len("\\end{align*}")],
                    ALIGN[:ALIGN.index("Hence $x = 3$.") + len("Hence $x = 3$.")]]
    assert hints.math_step_ends("Since $x = 1. Y$ holds, we stop. Answer: $\\boxed{1}$") == [
        len("Since $x = 1. Y$ holds, we stop.")]


def test_the_math_rule_without_a_box_keeps_the_last_step_back_and_a_box_first_leaves_no_step():
    text = "Step one.\nStep two.\nSo the answer is 7."
    assert [text[:e] for e in hints.math_step_ends(text)] == ["Step one.", "Step one.\nStep two."]
    assert hints.math_step_ends("The answer is $\\boxed{7}$. Indeed, 3 + 4 = 7.\nCheck: yes.") == []
    assert hints.math_step_ends("$\\boxed{7}$") == []
    assert hints.hint_text("\\fbox{7}", 1.0, HINT_RULE_MATH) is None


# ---------------------------------------------------------------- the rounding and the levels


@pytest.mark.parametrize("fraction, n_steps, k", [
    (0.25, 4, 1), (0.5, 4, 2), (0.75, 4, 3), (1.0, 4, 4),  # the toy's five-digit chains: 1 / 2 / 3 totals
    (0.25, 3, 1), (0.5, 3, 2), (0.75, 3, 2),  # nearest, ties up (1.5 -> 2)
    (0.25, 2, 1), (0.5, 2, 1), (0.75, 2, 2),  # 0.25 * 2 = 0.5 -> 1
    (0.01, 10, 1), (1.0, 1, 1), (0.58, 25, 15),  # at least one step; 0.58 * 25 is 14.499999999999998 in floats
])
def test_a_level_keeps_the_nearest_whole_number_of_steps_half_up(fraction, n_steps, k):
    assert hints.steps_for_fraction(fraction, n_steps) == k


@pytest.mark.parametrize("fraction, n_steps", [(0.0, 4), (1.5, 4), (0.5, 0)])
def test_a_level_outside_its_range_or_a_solution_without_steps_is_an_error(fraction, n_steps):
    with pytest.raises(ValueError):
        hints.steps_for_fraction(fraction, n_steps)


def test_levels_that_give_the_same_hint_are_one_level():
    assert hints.level_steps(LEVELS, 4) == [(0, 1), (1, 2), (2, 3)]
    assert hints.level_steps(LEVELS, 2) == [(0, 1), (2, 2)]  # 0.5 of 2 steps is 0.25's one step
    assert hints.level_steps(LEVELS, 1) == [(0, 1)]


# ---------------------------------------------------------------- the registry


def test_the_built_in_rules_are_registered_under_their_names_and_others_can_be_added():
    assert hints.HINT_RULES[HINT_RULE_TOY] is hints.toy_step_ends
    assert hints.HINT_RULES[HINT_RULE_MATH] is hints.math_step_ends
    assert GecConfig().hint_rule == HINT_RULE_MATH
    try:
        @hints.register_hint_rule("test_words")
        def word_ends(solution):
            return [m.end() for m in re.finditer(r"\w+", solution)][:-1]

        assert hints.hint_rule("test_words") is word_ends
        assert hints.hint_text("one two three four five", 0.5, "test_words") == "one two"
        assert GecConfig(mode="hint", hint_rule="test_words").validate().hint_rule == "test_words"
        hints.register_hint_rule("test_words")(word_ends)  # the same function again: a no-op
        with pytest.raises(ValueError, match="registered already"):
            hints.register_hint_rule("test_words")(lambda s: [])
    finally:
        hints.HINT_RULES.pop("test_words", None)
    with pytest.raises(ValueError, match=r"no hint rule 'test_words'; registered: \['math', 'toy'\]"):
        hints.hint_rule("test_words")


# ---------------------------------------------------------------- the hinted prompt


def _prompt_ids(tok, messages):
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def test_an_assistant_prefix_hint_is_the_start_of_the_assistant_turn_in_the_prompt(tok):
    messages = [{"role": "user", "content": "3+5+5+7+7="}]
    prompt_ids = _prompt_ids(tok, messages)
    hint_ids = tok.encode("3+5=8+5=13", add_special_tokens=False)
    hinted = hints.assistant_prefix_prompt_ids(prompt_ids, hint_ids)
    assert hinted[: len(prompt_ids)] == prompt_ids and hinted[len(prompt_ids):] == hint_ids
    assert tok.decode(hinted).endswith("<|im_start|>assistant\n3+5=8+5=13")
    # the prompt verl would have had, had the row's text been the templated prompt followed by the hint
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + "3+5=8+5=13"
    assert hinted == tok.encode(text, add_special_tokens=False)


def test_a_user_hint_is_the_template_appended_to_the_last_user_message(tok):
    messages = [{"role": "system", "content": "Reason step by step."}, {"role": "user", "content": "Find $x$."},
                {"role": "assistant", "content": "ok"}, {"role": "user", "content": "Now $y$."}]
    template = GecConfig().hint_template
    out = hints.user_hint_messages(messages, template, "We have $y = \\frac{1}{2}$.")
    assert out[3]["content"] == ("Now $y$.\nThe following text is the beginning part of the answer, which you can "
                                 "refer to for solving the problem:\nWe have $y = \\frac{1}{2}$.")
    assert out[:3] == messages[:3] and messages[3]["content"] == "Now $y$."  # the row's messages are not changed
    # braces in the template or the hint are text (not str.format)
    assert hints.user_hint_messages(messages[1:2], " Hint: {hint} (\\boxed{})", "a{b}")[0]["content"] == (
        "Find $x$. Hint: a{b} (\\boxed{})")
    parts = [{"type": "text", "text": "Find $x$."}]
    assert hints.user_hint_messages([{"role": "user", "content": parts}], "{hint}", "h")[0]["content"] == [
        *parts, {"type": "text", "text": "h"}]
    ids = _prompt_ids(tok, hints.user_hint_messages(messages[1:2], "\nHint: {hint}", "x = 2"))
    assert tok.decode(ids).endswith("Find $x$.\nHint: x = 2<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="needs a user message"):
        hints.user_hint_messages([{"role": "system", "content": "s"}], "{hint}", "h")


# ---------------------------------------------------------------- a row's levels and skip causes


def _plan(tok, solution, max_prompt_length, rule=HINT_RULE_TOY, levels=LEVELS):
    prompt_ids = _prompt_ids(tok, [{"role": "user", "content": "3+5+5+7+7="}])
    return hints.plan_row_hints(
        solution, fractions=levels, rule=rule, max_prompt_length=max_prompt_length,
        hinted_prompt_ids=lambda text: hints.assistant_prefix_prompt_ids(
            prompt_ids, tok.encode(text, add_special_tokens=False)))


def test_a_row_gets_its_distinct_levels_whose_hinted_prompt_fits(tok):
    solution = reason.solution(reason.DATA_SOURCE_CHAIN, (3, 5, 5, 7, 7))
    plan = _plan(tok, solution, 64)
    assert plan.skip == "" and plan.too_long == 0
    assert [(lv.level, lv.fraction, lv.steps, lv.text) for lv in plan.levels] == [
        (0, 0.25, 1, "3+5=8"), (1, 0.5, 2, "3+5=8+5=13"), (2, 0.75, 3, "3+5=8+5=13+7=20")]
    assert tok.decode(plan.levels[1].prompt_ids).endswith("assistant\n3+5=8+5=13")
    base = len(_prompt_ids(tok, [{"role": "user", "content": "3+5+5+7+7="}]))
    # room for the first level's hint only: the others are left out and counted, never cut
    short = _plan(tok, solution, base + len("3+5=8"))
    assert [lv.level for lv in short.levels] == [0] and short.too_long == 2 and short.skip == ""
    assert len(short.levels[0].prompt_ids) == base + len("3+5=8")
    none = _plan(tok, solution, base + 4)
    assert none.levels == [] and none.too_long == 3 and none.skip == hints.SKIP_PROMPT_TOO_LONG


def test_a_row_without_a_solution_or_without_a_step_is_skipped_with_its_cause(tok):
    assert _plan(tok, None, 64).skip == hints.SKIP_NO_SOLUTION
    assert _plan(tok, "  ", 64).skip == hints.SKIP_NO_SOLUTION
    assert _plan(tok, "27", 64).skip == hints.SKIP_NO_STEP  # the first toy's solution is its answer
    assert _plan(tok, "3+5=8+5=13#13", 64, rule=HINT_RULE_MATH).skip == hints.SKIP_NO_STEP  # the wrong rule
    assert set(hints.SKIP_CAUSES) == {hints.SKIP_NO_SOLUTION, hints.SKIP_NO_STEP, hints.SKIP_PROMPT_TOO_LONG}


# ---------------------------------------------------------------- the decisions


@pytest.mark.parametrize("step, warmup, due", [(1, 0, True), (None, 0, True), (50, 50, False), (51, 50, True),
                                               (1, 1, False)])
def test_hints_are_due_after_the_warm_up_steps(step, warmup, due):
    assert hints.hints_due(step, warmup) is due


def test_a_warm_up_without_the_step_is_an_error():
    with pytest.raises(ValueError, match="hint_warmup_steps"):
        hints.hints_due(None, 5)


def _run_group(scope, n, outcome):
    """A group of n all-wrong members through the decisions, as the agent loop would run them: ``outcome(level,
    member)`` is whether that member's hinted sample at that level is right. Returns (final level per member, the
    levels each member sampled)."""
    finals, sampled = [], []
    group_outcomes = []  # scope all: per level, whether some member was right
    if scope == "all":
        while (level := hints.next_hint_level(3, group_outcomes)) is not None:
            group_outcomes.append(any(outcome(level, m) for m in range(n)))
    for member in range(n):
        if not hints.samples_with_hints(scope, member):
            finals.append(None)
            sampled.append([])
            continue
        if scope == "all":
            outcomes = group_outcomes
        else:
            outcomes = []
            while (level := hints.next_hint_level(3, outcomes)) is not None:
                outcomes.append(outcome(level, member))
        finals.append(hints.final_hint_level(scope, outcomes))
        sampled.append(list(range(len(outcomes))))
    return finals, sampled


def test_scope_one_replaces_exactly_one_member_with_the_lowest_level_that_is_right():
    finals, sampled = _run_group("one", 8, lambda level, m: level >= 1)
    assert finals == [1] + [None] * 7 and sampled == [[0, 1]] + [[]] * 7
    finals, sampled = _run_group("one", 8, lambda level, m: True)
    assert finals == [0] + [None] * 7 and sampled[0] == [0]  # the lowest level: no higher one is tried
    finals, sampled = _run_group("one", 8, lambda level, m: False)
    assert finals == [None] * 8 and sampled[0] == [0, 1, 2]  # no level right: nobody is replaced


def test_scope_all_raises_the_level_while_the_group_stays_all_wrong():
    finals, sampled = _run_group("all", 4, lambda level, m: level == 2 and m == 3)
    assert finals == [2] * 4 and sampled == [[0, 1, 2]] * 4
    finals, _ = _run_group("all", 4, lambda level, m: m == 0)
    assert finals == [0] * 4  # right at the first level: no higher one
    finals, _ = _run_group("all", 4, lambda level, m: False)
    assert finals == [2] * 4  # all wrong at every level: the group ends all hinted, at the last level


def test_the_decisions_stop_at_the_usable_levels_and_refuse_an_unknown_scope():
    assert hints.next_hint_level(1, [False]) is None and hints.next_hint_level(0, []) is None
    assert hints.next_hint_level(3, []) == 0 and hints.next_hint_level(3, [False, True]) is None
    assert hints.final_hint_level("all", []) is None and hints.final_hint_level("one", [False, True]) == 1
    for bad in (lambda: hints.samples_with_hints("some", 0), lambda: hints.final_hint_level("some", [])):
        with pytest.raises(ValueError, match="hint_scope"):
            bad()


def test_a_hint_runs_first_generation_gets_the_whole_response_budget():
    cfg = GecConfig(mode="hint").validate()
    assert gec.first_generation_budget(cfg, 64, cue_tokens=1, answer_tokens=3) == 64
    assert gec.first_generation_budget(GecConfig(max_continuation_tokens=30), 64, cue_tokens=1,
                                       answer_tokens=3) == 33  # mode gec: unchanged


# ---------------------------------------------------------------- the step's metrics


def test_the_step_metrics_count_groups_levels_replacements_and_skips():
    K = hints
    rows = [
        # group a (scope one): member 0 tried levels 0 and 1, level 1 right and kept; the others unhinted
        {K.KEY_HINT_LEVEL: 1, K.KEY_HINT_ATTEMPTS: [[0, False], [1, True]], K.KEY_HINT_SKIP: "", K.KEY_HINT_TOO_LONG: 1},
        {K.KEY_HINT_LEVEL: -1, K.KEY_HINT_ATTEMPTS: [], K.KEY_HINT_SKIP: "", K.KEY_HINT_TOO_LONG: 1},
        # group b: no solution (both members carry the cause; counted once)
        {K.KEY_HINT_LEVEL: -1, K.KEY_HINT_ATTEMPTS: [], K.KEY_HINT_SKIP: K.SKIP_NO_SOLUTION, K.KEY_HINT_TOO_LONG: 0},
        {K.KEY_HINT_LEVEL: -1, K.KEY_HINT_ATTEMPTS: [], K.KEY_HINT_SKIP: K.SKIP_NO_SOLUTION, K.KEY_HINT_TOO_LONG: 0},
        # group c (scope all): both members at level 0, one right
        {K.KEY_HINT_LEVEL: 0, K.KEY_HINT_ATTEMPTS: [[0, True]], K.KEY_HINT_SKIP: "", K.KEY_HINT_TOO_LONG: 0},
        {K.KEY_HINT_LEVEL: 0, K.KEY_HINT_ATTEMPTS: [[0, False]], K.KEY_HINT_SKIP: "", K.KEY_HINT_TOO_LONG: 0},
        {},  # a row the hint mode did not write
    ]
    metrics = hints.hint_step_metrics(rows, ["a", "a", "b", "b", "c", "c", "d"], n_levels=3)
    assert metrics == {
        "hint/groups_hinted": 2.0, "hint/replaced": 3.0, "hint/levels_too_long": 1.0,
        "hint/level0/samples": 3.0, "hint/level0/acc": 1 / 3, "hint/level1/samples": 1.0, "hint/level1/acc": 1.0,
        "hint/level2/samples": 0.0,
        "hint/skipped/no_solution": 1.0, "hint/skipped/no_step": 0.0, "hint/skipped/prompt_too_long": 0.0,
    }

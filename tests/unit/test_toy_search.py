"""The reasoning toy's design search (``verl_ext/toy/designs.py``, ``verl_ext/toy/search.py``): the default recipe
untouched, each design's prompts and solutions, the precomputed control prompts equal to verl's, and a search unit
that runs without verl (the lent machines have none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_ext.toy import build, designs, reason, search
from verl_ext.toy import reason_reward as reward

ROOT = Path(__file__).parents[2]


def test_the_first_reasoning_toys_recipe_is_unchanged():
    """chain6 at h64l2 with the default recipe is the first reasoning toy (``+toy=chain6``): its fingerprint still
    names its packaged weights, and the search's cell draws its split and warm-up examples."""
    weights, record = build.shipped_weights("chain6")
    assert record["fingerprint"] == build._fingerprint("chain6") == "c65dfcf2a4"
    split = designs.split_for("chain6")
    assert split == reason.split_problems()
    assert designs.warmup_examples(designs.DESIGNS["chain6"], split) == designs.reason_warmup_examples(split)
    cell = designs.parse_cell("chain6/h64l2")
    assert cell.model_kw == designs.MODEL_KW and cell.recipe == designs.REASON_SFT
    assert cell.n_params() == record["n_params"]
    assert reason.make_rows(split=split) == reason.make_rows()


def _ops_ok(name: str, ops: tuple[int, ...]) -> bool:
    two = sum(x >= 10 for x in ops)
    return {"chain6": len(ops) == 6 and two == 0, "chain6_seen": len(ops) == 6 and two == 0,
            "twodigit": len(ops) in (3, 4) and two >= 2 and max(ops) < 100,
            "twodigit3": len(ops) == 3 and two == 3 and max(ops) < 100}[name]


@pytest.mark.parametrize("name", list(designs.FIXED_DESIGNS))
def test_each_design_prompts_and_solutions(name):
    design = designs.DESIGNS[name]
    split = designs.split_for(design)
    default = reason.split_problems()
    hard = design.source
    assert list(split.val) == [reason.DATA_SOURCE_CHAIN, reason.DATA_SOURCE_BAG, hard]
    for s in (reason.DATA_SOURCE_CHAIN, reason.DATA_SOURCE_BAG):  # the easy families are today's
        assert split.val[s] == default.val[s] and split.train[s] == default.train[s]
        assert split.warmup[s] == default.warmup[s]
    assert len(split.val[hard]) == reason.N_VAL and len(split.train[hard]) == designs.N_TRAIN_HARD
    assert all(_ops_ok(name, o) for o in split.val[hard] + split.train[hard])
    held_out = set(split.val[hard])
    assert not held_out & set(split.train[hard])
    if design.warmup_source is not None:  # the warm-up's family never holds a held-out or RL prompt
        warm = split.warmup[design.warmup_source]
        assert len(warm) > 500 and not set(warm) & (held_out | set(split.train[hard]))
    if name in ("chain6", "chain6_seen"):  # the same hard split as today's
        assert split.val[hard] == default.val[hard] and split.train[hard] == default.train[hard]
    if name == "twodigit3":
        assert all(sum(x >= 10 for x in o) == 1 for o in split.warmup[designs.CHAIN2D1])
    # reference solutions: the step format, graded right; a wrong attempt graded wrong
    lengths = []
    for ops in split.val[hard]:
        sol = reason.solution(hard, ops)
        assert reward.compute_score(hard, sol, str(sum(ops)))["acc"] == 1.0
        assert sol.count("=") == len(ops) - 1 and sol.startswith(f"{ops[0]}+{ops[1]}=")
        wrong = reason.wrong_attempt(hard, ops, __import__("random").Random(0))
        assert reward.compute_score(hard, wrong, str(sum(ops)))["acc"] == 0.0
        lengths.append(len(sol) + 1)  # byte tokens + EOS
    lengths.sort()
    median = lengths[len(lengths) // 2]
    assert {"chain6": 28 <= median <= 30, "chain6_seen": 28 <= median <= 30, "twodigit": 20 <= median <= 28,
            "twodigit3": 20 <= median <= 23}[name], median
    train, val = reason.make_rows(split=split)
    assert len(train) == 3000 and sum(r["data_source"] == hard for r in train) == designs.N_TRAIN_HARD
    assert {r["data_source"] for r in val} == {s + g for s in split.val for g in ("", "@greedy")}
    # the warm-up: the design's share of its family, the rest as today's
    recipe = {**designs.REASON_SFT, "examples": 4000}
    shares = search._warmup_shares(designs.warmup_examples(design, split, recipe), split)
    if design.warmup_share:
        assert abs(shares[design.warmup_source] - design.warmup_share) < 0.015
    else:
        assert set(shares) == {reason.DATA_SOURCE_CHAIN, reason.DATA_SOURCE_BAG}


def test_cell_specs():
    cell = designs.parse_cell("twodigit@0.02/h128l4:steps=1500,lr=2e-3")
    assert cell.design.warmup_share == 0.02 and cell.design.label == "twodigit@0.02"
    assert cell.model_kw["num_attention_heads"] == 4 and cell.model_kw["num_key_value_heads"] == 2
    assert cell.model_kw["intermediate_size"] == 256 and cell.recipe["steps"] == 1500 and cell.recipe["lr"] == 2e-3
    assert "/" not in cell.name
    assert cell.rl_lr == 2e-4  # the controls mirror the toy's RL run unless the cell says otherwise
    slow = designs.parse_cell("twodigit@0.02/h128l4:steps=1500,lr=2e-3,rl_lr=5e-5")
    assert slow.rl_lr == 5e-5 and slow.recipe == cell.recipe and slow.warmup_key == cell.warmup_key
    assert designs.parse_cell("twodigit/h128l4:steps=1500,lr=2e-3").warmup_key != cell.warmup_key
    strict = designs.parse_cell("chain5_unsolved@0.05/h128l2:unsolved_of=32,rl_lr=3e-5")
    assert strict.design.unsolved_of == 32 and strict.design.label == "chain5_unsolved@0.05(k=32)"
    assert strict.warmup_key != designs.parse_cell("chain5_unsolved@0.05/h128l2").warmup_key  # its own selection
    for bad in ("twodigit", "nope/h64l2", "chain6/h64", "chain6/h64l2:foo=1", "chain6@0.1/h64l2",
                "chain6/h64l2:unsolved_of=8", "chain5_unsolved/h64l2:unsolved_of=0"):
        with pytest.raises(ValueError):
            designs.parse_cell(bad)


def test_precomputed_prompts_are_the_ones_verl_draws():
    """The committed file holds, for every hard split, the prompts ``sft_control.step_prompts`` draws with verl's
    sampler (seed 1 checked here for every pool; the file is what ``--precompute-prompts`` writes)."""
    from verl_ext.toy import sft_control

    with open(search.PROMPTS_FILE) as f:
        prompts = json.load(f)
    assert prompts["steps"] == search.SFT_STEPS and prompts["seeds"] == list(search.SEEDS)
    assert set(prompts["pools"]) == {d.source for d in designs.FIXED_DESIGNS.values()}
    for name in ("chain6", "twodigit", "twodigit3"):
        design = designs.DESIGNS[name]
        for pool in search.POOLS:
            sources = search.pool_sources(design, pool)
            got = search.control_prompts(prompts, design, pool, 1, search.SFT_STEPS)
            assert got == sft_control.step_prompts(1, search.SFT_STEPS, sources, design=design)
            assert all(s == design.source for batch in got for s, _ in batch) == (pool == "hard")


@pytest.mark.parametrize("name", ["chain5_unsolved", "twodigit_unsolved"])
def test_a_selecting_design_takes_the_unsolved_candidates(name, monkeypatch):
    """A selecting design's hard split is the candidates the model solves in none of k samples, in order, none of them
    in the warm-up; the pool is refused before a selection, and a model that solves too many is refused loudly."""
    design = designs.DESIGNS[name]
    with pytest.raises(ValueError, match="picks its hard split"):
        designs.split_for(design)
    warm = designs.split_for(design, warmup_only=True)
    candidates = designs.hard_candidates(design)
    assert len(candidates) == designs.N_CANDIDATES and not set(candidates) & set(warm.warmup[design.source])
    assert len(warm.warmup[design.source]) > 5000
    calls = []

    def fake_sample(model, tok, prompts, max_new, temperature, seed):  # right only for operand sums divisible by 3
        calls.append(len(prompts))
        sums = [sum(int(x) for x in p.rstrip("=").split("+")) for p in prompts]
        return [{"text": f"#{t if t % 3 else t + 1}"} for t in sums]

    monkeypatch.setattr("verl_ext.toy.model.sample_responses", fake_sample)
    chosen = build.select_unsolved(None, None, design, seed=1)
    unsolved = [o for o in candidates if sum(o) % 3 == 0]
    want = reason.N_VAL + designs.N_TRAIN_HARD
    assert chosen["val"] + chosen["train"] == sorted(unsolved[:reason.N_VAL]) + sorted(unsolved[reason.N_VAL:want])
    # each chunk: one greedy reply per candidate, then k samples of each greedy-wrong one
    assert calls[0] == build.SELECT_CHUNK and calls[1] == design.unsolved_of * sum(
        sum(o) % 3 == 0 for o in candidates[:build.SELECT_CHUNK])
    assert 0.2 < chosen["unsolved_share"] < 0.5
    split = designs.split_for(design, chosen=chosen)
    assert split.val[design.source] == chosen["val"] and len(split.train[design.source]) == designs.N_TRAIN_HARD
    rows = designs.train_rows(design, (design.source,), chosen)
    with open(search.PROMPTS_FILE) as f:  # verl's order depends on the pool's size alone: a fixed pool's batches
        prompts = json.load(f)
    got = search.control_prompts(prompts, design, "hard", 1, search.SFT_STEPS, chosen)
    assert {o for batch in got for _, o in batch} <= set(chosen["train"]) and len(got) == search.SFT_STEPS
    assert len(rows) == designs.N_TRAIN_HARD
    monkeypatch.setattr("verl_ext.toy.model.sample_responses",
                        lambda model, tok, prompts, *a, **k: [{"text": f"#{sum(map(int, p[:-1].split('+')))}"}
                                                              for p in prompts])
    with pytest.raises(ValueError, match="solves this family too well"):
        build.select_unsolved(None, None, design, seed=1)


def test_criteria():
    fig = lambda acc, h=0.05, wrong=0.0, n=19, ref=19: {
        "acc_t1": acc, "acc_group": acc, "entropy_group": h, "all_wrong_groups": wrong, "median_len_group": n,
        "ref_median_len": ref}
    step0 = {"toy_chain": fig(0.86), "toy_bag": fig(0.2, h=0.3), "toy_chain2d": fig(0.01, wrong=0.9, n=22, ref=23)}
    after = {"hard": {"toy_chain": fig(0.83), "toy_bag": fig(0.2), "toy_chain2d": fig(0.15)},
             "mixture": {"toy_chain": fig(0.84), "toy_bag": fig(0.1), "toy_chain2d": fig(0.1)}}
    rec = {"hard_source": "toy_chain2d", "seeds": [1, 2], "warmup": {"step0": step0},
           "controls": {f"{p}-{s}": {"ok": True, "after": after[p]} for p in search.POOLS for s in (1, 2)}}
    cr = search.criteria(rec)
    assert cr["a"]["pass"] and cr["a"]["entropy_ratio"] == 6.0
    assert cr["b"]["pass"] and cr["b"]["hard_gain_mean"] == 0.14
    assert not cr["c"]["pass"] and cr["c"]["worst"] == -0.1  # toy_bag fell by 0.1
    step0["toy_chain2d"]["median_len_group"] = 19  # stops early: not a complete attempt
    assert not search.criteria(rec)["a"]["checks"]["complete_attempts"]
    rec["controls"].pop("hard-2")
    assert search.criteria(rec)["b"] is None  # an unfinished control: no verdict


def test_a_search_unit_runs_without_verl(tmp_path):
    """``import verl_ext.toy.search``, a cell's warm-up and one control (tiny: 2 warm-up steps, 1 control step,
    2 held-out prompts) import none of verl, ray, torchdata, omegaconf: the lent machines have none of them."""
    code = f"""
import sys
from pathlib import Path
import verl_ext.toy.search as s
opts = {{"sft_steps": 1, "n_val": 2, "device": "cpu", "warmup_steps": 2}}
for kind, pool, seed in (("warmup", None, None), ("control", "hard", 2)):
    s._unit_main(kind, "twodigit/h64l2", pool, seed, {str(tmp_path)!r}, str(s.PROMPTS_FILE), opts,
                 {str(tmp_path)!r} + f"/{{kind}}.json")
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("verl", "ray", "torchdata", "omegaconf"))
assert not bad, bad
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warm = json.loads((tmp_path / "warmup.json").read_text())
    control = json.loads((tmp_path / "control.json").read_text())
    assert warm["ok"] and control["ok"], (warm.get("traceback"), control.get("traceback"))
    assert warm["sft"]["sft_steps"] == 2 and set(warm["step0"]) == {"toy_chain", "toy_bag", "toy_chain2d"}
    assert warm["step0"]["toy_chain2d"]["group_samples"] == search.GROUP_SAMPLES
    assert control["steps"] == 1 and control["pool"] == "hard" and control["after"]["toy_chain"]["n"] == 2


def _fake_unit(kind, spec, pool, seed, work, prompts_path, opts, result):
    """A unit that writes what it was given (forked: it is what the search starts)."""
    fig = {"acc_t1": 0.5, "acc_group": 0.5, "entropy_group": 0.1, "all_wrong_groups": 0.0, "median_len_group": 19,
           "ref_median_len": 19}
    out = {"ok": True, "seconds": 0.1, "spec": spec, "work": work}
    if kind == "warmup":
        out["step0"] = {"toy_chain": fig, "toy_bag": fig, "toy_chain2d": fig}
    else:
        out["after"] = {"toy_chain": fig, "toy_bag": fig, "toy_chain2d": fig}
    with open(result, "w") as f:
        json.dump(out, f)


def test_cells_that_differ_in_their_controls_share_one_warm_up(tmp_path, monkeypatch):
    monkeypatch.setattr(search, "_unit_main", _fake_unit)
    opts = {"sft_steps": 60, "n_val": None, "device": "cpu", "warmup_steps": None}
    specs = ["twodigit/h64l2", "twodigit/h64l2:rl_lr=5e-5", "twodigit/h64l2:steps=10"]
    summary = search.search(specs, tmp_path, 2, opts, str(search.PROMPTS_FILE), 60, None, seeds=(1,), log=lambda m: None)
    cells = summary["cells"]
    shared, other = cells["twodigit-h64l2"]["warmup"], cells["twodigit-h64l2-steps=10"]["warmup"]
    assert shared == cells["twodigit-h64l2-rl_lr=5e-5"]["warmup"]
    assert shared["shared_with"] == ["twodigit-h64l2", "twodigit-h64l2-rl_lr=5e-5"] and "shared_with" not in other
    assert other["work"] != shared["work"]
    for name in ("twodigit-h64l2", "twodigit-h64l2-rl_lr=5e-5"):  # both cells' controls read the shared model
        controls = cells[name]["controls"]
        assert set(controls) == {"hard-1", "mixture-1"} and {c["work"] for c in controls.values()} == {shared["work"]}
        assert cells[name]["criteria"]["b"] is not None
    assert cells["twodigit-h64l2-rl_lr=5e-5"]["rl_lr"] == 5e-5


def test_a_reasoning_toys_cell_has_the_learning_rate_its_config_trains_with():
    """One definition, ``designs.TASK_LR``: each reasoning toy's cell carries the RL learning rate its config resolves
    (the default toy's 2e-5, docs/toy.md), not the search cells' default (chain6's 2e-4)."""
    from omegaconf import OmegaConf

    from verl_ext.main import toy_rl_lr

    lr = OmegaConf.select(OmegaConf.load(ROOT / "hydra_configs" / "toy_cpu.yaml"), "actor_rollout_ref.actor.optim.lr")
    assert lr == 2e-5 == designs.reason_cell(build.DEFAULT_TASK).rl_lr
    for task, spec in designs.REASON_TASKS.items():
        assert "rl_lr" not in spec, f"{task}: its rate is TASK_LR's"
        assert designs.reason_cell(task).rl_lr == designs.TASK_LR[task] == toy_rl_lr(task), task


def test_a_cells_parameter_count_reads_the_tokenizers_vocabulary(monkeypatch):
    from verl_ext.toy import tokenizer

    assert len(tokenizer.build_tokenizer()) == tokenizer.VOCAB_SIZE
    cell = designs.parse_cell("chain6/h64l2")
    count = cell.n_params()
    monkeypatch.setattr(tokenizer, "VOCAB_SIZE", tokenizer.VOCAB_SIZE + 1)
    assert cell.n_params() == count + cell.model_kw["hidden_size"]  # one more tied embedding row


def test_the_default_toy_is_the_searchs_cell():
    """The default toy (``chain5_unsolved``) is the search's pick, its learning rate the default config's; the first
    reasoning toy (``chain6``, ``+toy=chain6``) keeps its fingerprint (and so its packaged weights) and its own rate."""
    import yaml

    from verl_ext.main import toy_rl_lr

    assert build.DEFAULT_TASK == "chain5_unsolved"
    cell = designs.reason_cell("chain5_unsolved")
    assert cell.design.unsolved_of == 32 and cell.design.warmup_share == 0.05 and cell.size == "h128l2"
    assert designs.reason_cell("chain6").design == designs.DESIGNS["chain6"]
    assert build._fingerprint("chain6") == "c65dfcf2a4" and build._fingerprint("chain5_unsolved") != "c65dfcf2a4"
    # each toy's config reads its learning rate from designs.TASK_LR, the one copy (2e-5: the search's pick)
    for task, path, ref in (("chain5_unsolved", "toy_cpu.yaml", "${verl_ext_toy:rl_lr}"),
                            ("chain6", "toy/chain6.yaml", "${verl_ext_toy:rl_lr,chain6}"),
                            ("add", "toy/add.yaml", "${verl_ext_toy:rl_lr,add}")):
        with open(ROOT / "hydra_configs" / path) as f:
            assert yaml.safe_load(f)["actor_rollout_ref"]["actor"]["optim"]["lr"] == ref, path
        assert toy_rl_lr(None if task == build.DEFAULT_TASK else task) == designs.TASK_LR[task]
    assert designs.TASK_LR["chain5_unsolved"] == 2e-5 and designs.TASK_LR["chain6"] == 2e-4
    with pytest.raises(ValueError, match="toy task 'nope'"):
        toy_rl_lr("nope")
    assert build.check_train_sources(["toy_chain5"], "chain5_unsolved") == ("toy_chain5",)
    with pytest.raises(ValueError, match="picked by its build"):
        build.reason_split("chain5_unsolved", {})

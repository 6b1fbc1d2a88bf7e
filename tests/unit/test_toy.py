"""Fast tests for the embedded toy tasks (verl_ext.toy): the first task ("add", one real build, ~8 s) and the
reasoning tasks: the first one ("chain6", built here with a short warm-up: its data, reward and determinism do not
depend on the warm-up's length) and the default ("chain5_unsolved", from its packaged weights and picked hard split;
its from-scratch warm-up and pick are checked in tests/e2e/test_toy_build.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from verl_ext.toy import ToyAssets, build_toy_assets
from verl_ext.toy import build as toy_build
from verl_ext.toy import designs as toy_designs
from verl_ext.toy import task as toy_task

TEXTS = ["3+4=?", "hello world", "  two  spaces\nnew\n\nlines\ttab ", "\n", " ", "naïve 中文 ünï", "<think>x</think>"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> ToyAssets:
    return build_toy_assets(cache_dir=tmp_path_factory.mktemp("toycache"), verbose=False, task="add")


@pytest.fixture(scope="module")
def tok(assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assets.model_path)


@pytest.fixture(scope="module")
def reward(assets):
    spec = importlib.util.spec_from_file_location("toy_reward_under_test", assets.reward_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, assets.reward_name)


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_loaded_as_qwen2_and_specials(tok):
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert 260 <= len(tok) <= 264
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<pad>"
    assert tok.padding_side == "left"
    for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1
    # byte ids: token id == byte value
    assert tok.encode("7", add_special_tokens=False) == [ord("7")]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.encode("utf-8"))  # no merges: one token per byte
    assert tok.decode(ids) == text


def test_newline_is_one_token(tok):
    assert tok.encode("\n", add_special_tokens=False) == [10]


def test_verl_qwen_continuous_token_builder_accepts_tokenizer(tok):
    ct = pytest.importorskip("verl.utils.tokenizer.continuous_token")
    ct.QwenContinuousTokenBuilder(tok)  # raises if "\n" is not exactly one token


def test_chat_template(tok):
    msgs = [{"role": "user", "content": "3+4=?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\n3+4=?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and len(ids) < 32
    full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "7"}], tokenize=False)
    assert full.endswith("<|im_start|>assistant\n7<|im_end|>\n")
    # verl decodes responses with skip_special_tokens=True
    assert tok.decode([ord("7"), tok.eos_token_id], skip_special_tokens=True) == "7"


# ---------------------------------------------------------------- reward


def test_reward_cases(reward):
    def s(sol, gt):
        r = reward("toy_add", sol, gt, extra_info={})
        assert set(r) == {"score", "acc", "format"}
        assert all(isinstance(v, float) for v in r.values())
        return r

    assert s("7", "7") == {"score": 1.0, "acc": 1.0, "format": 1.0}
    assert s("7<|im_end|>", "7")["acc"] == 1.0  # EOS text kept by the decoder
    assert s("7<|im_end|><pad>", "7")["score"] == 1.0
    assert s(" 7\n", "7")["score"] == 1.0
    assert s("12", "12")["score"] == 1.0
    assert s("8", "7") == {"score": 0.0, "acc": 0.0, "format": 1.0}
    assert s("1", "12") == {"score": 0.0, "acc": 0.0, "format": 0.0}
    for bad in ("77", "a", "", "7x", "7 7", "<|im_end|>7"):
        assert s(bad, "7")["score"] == 0.0, bad


def test_shaped_reward(assets):
    spec = importlib.util.spec_from_file_location("toy_reward_shaped", assets.reward_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    f = mod.compute_score_shaped
    assert f("toy_add", "7", "7") == {"score": 1.0, "acc": 1.0, "format": 1.0}
    assert f("toy_add", "8", "7")["score"] == pytest.approx(0.3)
    assert f("toy_add", "77", "7")["score"] == pytest.approx(0.1)  # right digit, wrong length
    assert f("toy_add2", "1", "12")["score"] == pytest.approx(0.1)  # no first-digit credit
    assert f("toy_add2", "13", "12")["score"] == pytest.approx(0.3)
    assert f("toy_add", "x7", "7")["score"] == 0.0


# ---------------------------------------------------------------- data


def _rows(path):
    return pd.read_parquet(path).to_dict("records")


def _operands(row) -> tuple[int, ...]:
    return tuple(int(x) for x in list(row["prompt"])[0]["content"].removesuffix("=?").split("+"))


def test_parquet_schema(assets, reward):
    for path, split in ((assets.train_parquet, "train"), (assets.val_parquet, "test")):
        rows = _rows(path)
        assert rows
        for i, r in enumerate(rows):
            assert set(r) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
            prompt = list(r["prompt"])
            assert len(prompt) == 1 and prompt[0]["role"] == "user"
            ops = _operands(r)
            assert len(ops) in (2, 3) and all(0 <= x <= 9 for x in ops)
            gt = r["reward_model"]["ground_truth"]
            assert r["reward_model"]["style"] == "rule" and gt == str(sum(ops))
            assert r["ability"] == "arith"
            ei = r["extra_info"]
            greedy = r["data_source"].endswith("@greedy")
            assert r["data_source"].removesuffix("@greedy") == ("toy_add" if sum(ops) <= 9 else "toy_add2")
            assert greedy == (ei.get("sampling_params") is not None)
            if greedy:  # the papers' evaluation: n=1, greedy (read by the gec_agent loop, row_sampling_params)
                assert split == "test" and ei["sampling_params"]["temperature"] == 0.0
            assert ei["split"] == split and ei["index"] == i and ei["solution"] == gt
            assert reward(r["data_source"], gt, gt, extra_info=ei)["acc"] == 1.0


def test_split_held_out_and_mix(assets):
    train_rows, val_rows = _rows(assets.train_parquet), _rows(assets.val_parquet)
    train, val = {_operands(r) for r in train_rows}, {_operands(r) for r in val_rows}
    assert not train & val
    # at least 100 held-out prompts per data source, each sampled VAL_SAMPLES times and once greedy
    for source in ("toy_add", "toy_add2"):
        sampled = [_operands(r) for r in val_rows if r["data_source"] == source]
        greedy = [_operands(r) for r in val_rows if r["data_source"] == source + "@greedy"]
        assert len(set(greedy)) == len(greedy) >= 100
        assert sorted(sampled) == sorted(greedy * toy_task.VAL_SAMPLES)
    frac_two = sum(r["data_source"] == "toy_add2" for r in train_rows) / len(train_rows)
    assert 0.25 <= frac_two <= 0.35
    assert {len(ops) for ops in train} == {2, 3}  # two and three operands in training
    assert toy_task.make_rows() == toy_task.make_rows()  # deterministic


# ---------------------------------------------------------------- model + build


def test_model_files_and_config(assets):
    files = set(os.listdir(assets.model_path))
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= files
    with open(os.path.join(assets.model_path, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "qwen2" and cfg["hidden_size"] == 64 and cfg["num_hidden_layers"] == 2
    assert cfg["num_attention_heads"] == 2 and cfg["num_key_value_heads"] == 1 and cfg["tie_word_embeddings"]
    # 32: a head size vLLM's CPU attention supports (16 is not), so the vllm rollout backend can serve this model
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32
    assert cfg["vocab_size"] == 260
    with open(os.path.join(assets.model_path, "generation_config.json")) as f:
        gen = json.load(f)
    assert gen["eos_token_id"] == 258 and gen["pad_token_id"] == 259


def test_model_loads_and_warmup_stats(assets, tok):
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(assets.model_path)
    assert m.dtype == torch.float32
    ev = assets.stats["eval"]
    # warmed up but not overfit: GRPO needs both signal and entropy
    assert 0.3 <= ev["train_one"]["acc_t1"] <= 0.6
    assert ev["val_one"]["acc_t1"] >= 0.2
    assert ev["train_one"]["entropy_first"] > 0.8
    assert ev["train_two"]["acc_t1"] < 0.01
    enc = tok(tok.apply_chat_template([{"role": "user", "content": "3+4=?"}], add_generation_prompt=True, tokenize=False),
              return_tensors="pt")
    out = m.generate(**enc, do_sample=False, max_new_tokens=3)
    assert out.shape[1] <= enc["input_ids"].shape[1] + 3


def test_build_is_cached(assets, monkeypatch):
    assert assets.built
    root = assets.root

    def boom(*a, **k):
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(toy_build, "_build_into", boom)
    t0 = time.time()
    again = build_toy_assets(cache_dir=os.path.dirname(root), verbose=False, task="add")
    assert time.time() - t0 < 1.0
    assert not again.built and again.root == root and again.model_path == assets.model_path
    assert again.stats == assets.stats
    with pytest.raises(AssertionError, match="rebuilt"):
        build_toy_assets(cache_dir=os.path.dirname(root), force=True, verbose=False, task="add")
    assert os.path.isdir(assets.model_path)  # a failed forced rebuild leaves the cache intact
    assert not [p for p in os.listdir(os.path.dirname(root)) if p.startswith(".building-")]


def test_default_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_EXT_CACHE", str(tmp_path))
    assert toy_build.default_cache_dir() == tmp_path
    monkeypatch.delenv("VERL_EXT_CACHE")
    assert str(toy_build.default_cache_dir()).endswith(os.path.join(".cache", "verl_ext", "toy"))


# ---------------------------------------------------------------- the reasoning tasks (chain6 built here)

from verl_ext.toy import reason as toy_reason  # noqa: E402  (the reasoning task's tests start here)

SHORT_SFT = {"steps": 40, "examples": 400}


@pytest.fixture(scope="module")
def reason_builds(tmp_path_factory):
    """Two builds of the first reasoning task (chain6, short warm-up) into two caches: the second must repeat the
    first."""
    mp = pytest.MonkeyPatch()
    mp.setattr(toy_designs, "REASON_SFT", {**toy_designs.REASON_SFT, **SHORT_SFT})
    try:
        a = build_toy_assets(cache_dir=tmp_path_factory.mktemp("reason_a"), verbose=False, task="chain6")
        b = build_toy_assets(cache_dir=tmp_path_factory.mktemp("reason_b"), verbose=False, task="chain6")
    finally:
        mp.undo()
    return a, b


def test_the_reasoning_tasks(reason_builds):
    a, _ = reason_builds
    assert toy_build.DEFAULT_TASK == "chain5_unsolved" and a.stats["task"] == "chain6"
    assert a.reward_path.endswith("reason_reward.py") and os.path.basename(a.root).startswith("toy-chain6-")
    assert toy_build.REWARD_PATHS["chain5_unsolved"] == a.reward_path
    with pytest.raises(ValueError, match="toy task"):
        build_toy_assets(task="nope")


def test_two_builds_give_identical_weights(reason_builds):
    from safetensors.torch import load_file

    a, b = reason_builds
    assert a.root != b.root and a.built and b.built
    assert a.stats["weights_sha256"] == b.stats["weights_sha256"] == toy_build.weights_sha256(a.model_path)
    wa, wb = (load_file(os.path.join(x.model_path, "model.safetensors")) for x in (a, b))
    assert wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)
    assert a.stats["step0"] == b.stats["step0"]  # the build's figures come from seeded generation too
    assert a.stats["sft"]["sft_steps"] == SHORT_SFT["steps"]  # a fixed length, no accuracy-target stop


def test_build_prints_fingerprint_and_step0(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(toy_designs, "REASON_SFT", {**toy_designs.REASON_SFT, "steps": 2, "examples": 50})
    assets = build_toy_assets(cache_dir=tmp_path, verbose=True, task="chain6")
    out = capsys.readouterr().out
    assert assets.stats["fingerprint"] in out and assets.stats["weights_sha256"][:12] in out
    for source in toy_reason.DATA_SOURCES:
        assert f"{source}: acc@T1=" in out


def test_reason_solutions_and_answers():
    assert toy_reason.prompt_text("toy_chain", (3, 4, 2, 5)) == "3+4+2+5="
    assert toy_reason.prompt_text("toy_bag", (3, 4, 2, 5)) == "{3,4,2,5}="
    assert toy_reason.solution("toy_chain", (3, 4, 2, 5)) == "3+4=7+2=9+5=14#14"
    assert toy_reason.solution("toy_bag", (3, 4, 2, 5), order=(3, 0, 2, 1)) == "5+3=8+2=10+4=14#14"
    assert toy_reason.solution("toy_chain6", (9,) * 6) == "9+9=18+9=27+9=36+9=45+9=54#54"
    assert toy_reason.solution("toy_chain", (3, 4, 2), error=(0, 1)) == "3+4=8+2=10#10"  # wrong, then consistent
    rng = __import__("random").Random(0)
    for source, ops in (("toy_chain", (1, 2, 3)), ("toy_bag", (5, 6, 0, 9)), ("toy_chain6", (1, 0, 9, 9, 2, 3))):
        sol = toy_reason.solution(source, ops)
        assert toy_reason.final_answer(sol) == str(sum(ops))
        for _ in range(20):
            wrong = toy_reason.wrong_attempt(source, ops, rng)
            assert toy_reason.final_answer(wrong) != str(sum(ops))
            assert wrong.count("=") == sol.count("=")  # the same steps, one of them off


@pytest.mark.parametrize("sources", [None, ("toy_chain6",)], ids=["mixture", "toy_chain6"])
def test_sft_control_draws_the_prompts_verl_gives_the_rl_run(reason_builds, sources):
    """The supervised control (GEC's solution branch without RL) trains on the RL run's prompts, step by step: the
    rows of the parquet verl reads, in the order of verl's own seeded sampler and training dataloader (the toy's batch,
    ``drop_last``), and on their reference solutions. Trained on ``toy_chain6`` alone, 60 steps cross an epoch boundary (600 rows: 37 full
    batches an epoch)."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler

    from verl_ext.config import GecConfig
    from verl_ext.toy import sft_control

    a, _ = reason_builds
    df = pd.read_parquet(toy_build.train_parquet_for(a, sources))
    rows = [(src, tuple(int(x) for x in info["operands"])) for src, info in zip(df["data_source"], df["extra_info"])]
    seed, steps, batch = 3, 60, sft_control.BATCH_PROMPTS
    toy_config = OmegaConf.load(Path(__file__).parents[2] / "hydra_configs" / "toy_cpu.yaml")
    assert batch == toy_config.data.train_batch_size
    sampler = create_rl_sampler(OmegaConf.create({"shuffle": True, "seed": seed}), rows)
    loader = StatefulDataLoader(range(len(rows)), batch_size=batch, drop_last=True, sampler=sampler)
    expected = []
    while len(expected) < steps:  # verl's fit(): a fresh pass of the dataloader each epoch
        expected += [[rows[i] for i in b.tolist()] for b in loader]
    assert (len(rows) < steps * batch) == (sources is not None)  # the mixture stays in one epoch, toy_chain6 does not
    assert sft_control.step_prompts(seed, steps, sources, "chain6") == expected[:steps]
    # and trains on the text GEC's solution branch injects for them: extra_info[algorithm.gec.solution_key]
    key = GecConfig().solution_key
    assert all(toy_reason.solution(src, ops) == info[key]
               for (src, ops), info in zip(rows, df["extra_info"]))


def test_reason_reward(reason_builds):
    a, _ = reason_builds
    spec = importlib.util.spec_from_file_location("reason_reward_under_test", a.reward_path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    f = getattr(mod, a.reward_name)

    def s(text, gt="14"):
        r = f("toy_chain", text, gt, extra_info={})
        assert set(r) == {"score", "acc", "format"} and all(isinstance(v, float) for v in r.values())
        return r

    assert s("3+4=7+2=9+5=14#14") == {"score": 1.0, "acc": 1.0, "format": 1.0}
    assert s("3+4=7+2=9+5=13#13")["score"] == 0.0 and s("3+4=7+2=9+5=13#13")["format"] == 1.0
    assert s("3+4=7+2=9+5=13#13!3+4=7+2=9+5=14#14")["score"] == 1.0  # the last answer counts (a repair)
    assert s("3+4=7+2=9+5=14#14!#13")["score"] == 0.0
    assert s("3+4=7+2=9+5=13#13!#14")["score"] == 1.0  # GEC's answer template "!#{answer}"
    assert s("#14<|im_end|>")["score"] == 1.0 and s("#14 ")["score"] == 1.0
    for bad in ("", "14", "3+4=7+2=9+5=14", "#", "#14x", "#1 4", "<|im_end|>#14"):
        assert s(bad) == {"score": 0.0, "acc": 0.0, "format": s(bad)["format"]}, bad
    assert s("")["format"] == 0.0 and s("14")["format"] == 0.0


def test_reason_data(reason_builds):
    a, _ = reason_builds
    train, val = _rows(a.train_parquet), _rows(a.val_parquet)

    def key(r):
        return r["data_source"].removesuffix("@greedy"), next(iter(r["prompt"]))["content"]

    assert not {key(r) for r in train} & {key(r) for r in val}
    sp = toy_reason.split_problems()
    for source in toy_reason.DATA_SOURCES:
        sampled = [key(r) for r in val if r["data_source"] == source]
        greedy = [key(r) for r in val if r["data_source"] == source + "@greedy"]
        assert len(set(greedy)) == len(greedy) >= 100
        assert sorted(sampled) == sorted(greedy * toy_reason.VAL_SAMPLES)
        held_out = {toy_reason.prompt_text(source, o) for o in sp.val[source]}
        assert {c for _, c in greedy} == held_out
        # warm-up prompts are neither trained on by RL nor held out; the hard split has none
        warm = set(sp.warmup.get(source, []))
        assert not warm & set(sp.val[source]) and not warm & set(sp.train[source])
    assert "toy_chain6" not in sp.warmup
    # chain and bag never share an operand tuple (the same digits in the same order)
    assert not set(sp.val["toy_chain"] + sp.train["toy_chain"]) & set(sp.val["toy_bag"] + sp.train["toy_bag"])
    assert {r["data_source"] for r in train} == set(toy_reason.DATA_SOURCES)
    assert 0.15 <= sum(r["data_source"] == "toy_chain6" for r in train) / len(train) <= 0.25
    for r in train[:50] + val[:50] + val[-50:]:
        ei, gt = r["extra_info"], r["reward_model"]["ground_truth"]
        assert gt == str(sum(ei["operands"])) and toy_reason.final_answer(ei["solution"]) == gt
        assert (ei.get("sampling_params") is not None) == r["data_source"].endswith("@greedy")
    assert toy_reason.make_rows() == toy_reason.make_rows()


def test_reason_fits_the_toy_config(reason_builds):
    """Prompts fit data.max_prompt_length and the longest solution + EOS fits GEC's first-generation budget: the
    default config's lengths serve both reasoning toys (+toy=chain6 keeps them), so six-digit chains must fit."""
    from omegaconf import OmegaConf

    from verl_ext.main import config_dir

    a, _ = reason_builds
    cfg = OmegaConf.load(os.path.join(config_dir(), "toy_cpu.yaml"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model_path)
    msg = [{"role": "user", "content": toy_reason.prompt_text("toy_chain6", (9,) * 6)}]
    longest_prompt = len(tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=True))
    assert longest_prompt <= cfg.data.max_prompt_length
    first_budget = cfg.data.max_response_length - (len(cfg.algorithm.gec.cue) + cfg.algorithm.gec.max_continuation_tokens)
    longest = len(toy_reason.solution("toy_chain6", (9,) * 6))
    assert longest + 1 <= first_budget and longest + 1 <= cfg.algorithm.gec.max_continuation_tokens
    assert cfg.algorithm.gec.cue == toy_reason.CUE and cfg.algorithm.gec.answer_template == toy_reason.ANSWER_TEMPLATE


@pytest.mark.parametrize("task", ["chain5_unsolved", "chain6"])
def test_a_build_copies_the_packaged_weights(tmp_path, task):
    # the reasoning toys' warmed-up weights ship in the package: every machine starts from the same bits, and the
    # build takes seconds (the default's from-scratch warm-up and pick are tests/e2e/test_toy_build.py)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_ext.toy import model as toy_model

    weights, record = toy_build.shipped_weights(task)
    assert weights.stat().st_size < 2_000_000 and record["fingerprint"] == toy_build._fingerprint(task)
    assets = build_toy_assets(cache_dir=tmp_path, verbose=False, task=task)
    assert assets.built and assets.stats["weights_source"] == "shipped"
    assert assets.stats["weights_sha256"] == record["weights_sha256"] == toy_build.weights_sha256(assets.model_path)
    assert assets.stats["step0"] == record["step0"]
    # the copied weights are the warmed-up model: greedy, it solves held-out chains (0.98-1.00 at step 0)
    tok = AutoTokenizer.from_pretrained(assets.model_path)
    model = AutoModelForCausalLM.from_pretrained(assets.model_path)
    ops = toy_reason.split_problems().val[toy_reason.DATA_SOURCE_CHAIN][:5]
    outs = toy_model.sample_responses(model, tok, [toy_reason.prompt_text(toy_reason.DATA_SOURCE_CHAIN, o) for o in ops],
                                      toy_build.EVAL_MAX_TOKENS, 0.0, seed=0)
    assert [toy_reason.final_answer(o["text"]) for o in outs] == [str(toy_reason.answer(o)) for o in ops]
    if task != "chain5_unsolved":
        return
    # the default's hard split is the one its build picked (the record's), held out and trained on as picked
    picked = record["hard_split"]
    assert record["selection"]["samples"] == 32
    val = {tuple(r["extra_info"]["operands"]) for r in _rows(assets.val_parquet) if r["data_source"] == "toy_chain5"}
    assert val == {tuple(o) for o in picked["val"]} and len(val) == toy_reason.N_VAL
    hard = build_toy_assets(cache_dir=tmp_path, verbose=False, task=task, train_sources=["toy_chain5"])
    train = _rows(hard.train_parquet)
    assert {r["data_source"] for r in train} == {"toy_chain5"}
    assert sorted(tuple(r["extra_info"]["operands"]) for r in train) == sorted(tuple(o) for o in picked["train"])


# ---------------------------------------------------------------- toy.train_sources: the hard split only, etc.


@pytest.fixture(scope="module")
def shipped_cache(tmp_path_factory):
    """A chain6 build (the packaged weights copied: seconds) in its own cache, for the train_sources tests."""
    cache = tmp_path_factory.mktemp("sources")
    return cache, build_toy_assets(cache_dir=cache, verbose=False, task="chain6")


def test_train_sources_default_is_the_full_pool(shipped_cache):
    cache, full = shipped_cache
    from pathlib import Path

    before = Path(full.train_parquet).read_bytes()
    # no option, or all three sources in any order: the full pool's own file, bit for bit
    for sources in (None, list(toy_reason.DATA_SOURCES), ["toy_chain6", "toy_bag", "toy_chain"]):
        a = build_toy_assets(cache_dir=cache, verbose=False, task="chain6", train_sources=sources)
        assert a.train_parquet == full.train_parquet and Path(a.train_parquet).read_bytes() == before
    assert _records(full.train_parquet) == _records_of(toy_reason.make_rows()[0])  # today's rows
    assert toy_build.check_train_sources(None, "chain6") is None
    assert toy_build.check_train_sources(list(toy_reason.DATA_SOURCES), "chain6") is None


def _records(path, sources=None) -> str:
    """A parquet's rows as JSON (comparable: its nested columns come back as numpy arrays), optionally only those of
    some data sources."""
    df = pd.read_parquet(path)
    if sources is not None:
        df = df[df["data_source"].isin(sources)].reset_index(drop=True)
    return df.to_json(orient="records")


def _records_of(rows) -> str:  # rows as they come back from a parquet
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rows-{os.getpid()}-{time.time_ns()}.parquet")
    try:
        toy_task.write_parquet(rows, path)
        return _records(path)
    finally:
        os.remove(path)


def test_train_sources_hard_split_only(shipped_cache):
    cache, full = shipped_cache
    hard = build_toy_assets(cache_dir=cache, verbose=False, task="chain6", train_sources=["toy_chain6"])
    assert hard.train_parquet != full.train_parquet and os.path.dirname(hard.train_parquet) == full.root
    assert (hard.model_path, hard.val_parquet, hard.reward_path) == (full.model_path, full.val_parquet, full.reward_path)
    train, pool = _rows(hard.train_parquet), _rows(full.train_parquet)
    assert {r["data_source"] for r in train} == {"toy_chain6"}
    # the same rows per source: the full pool's toy_chain6 rows, in their order (fewer rows overall)
    assert _records(hard.train_parquet) == _records(full.train_parquet, ["toy_chain6"])
    assert len(train) == toy_reason.N_TRAIN["toy_chain6"] < len(pool)
    # validation keeps all three families, sampled and greedy
    val_sources = {r["data_source"] for r in _rows(hard.val_parquet)}
    assert val_sources == {s + g for s in toy_reason.DATA_SOURCES for g in ("", "@greedy")}
    # two sources: both, in the pool's order; written once and reused
    two = build_toy_assets(cache_dir=cache, verbose=False, task="chain6", train_sources=["toy_chain6", "toy_chain"])
    assert os.path.basename(two.train_parquet) == "train-toy_chain+toy_chain6.parquet"
    assert _records(two.train_parquet) == _records(full.train_parquet, ["toy_chain", "toy_chain6"])
    mtime = os.path.getmtime(two.train_parquet)
    build_toy_assets(cache_dir=cache, verbose=False, task="chain6", train_sources=["toy_chain", "toy_chain6"])
    assert os.path.getmtime(two.train_parquet) == mtime
    assert toy_build.check_train_sources("toy_bag", "chain6") == ("toy_bag",)  # one name: a one-item list


@pytest.mark.parametrize("bad, match", [
    ([], "at least one data source"),
    (["toy_x"], r"\['toy_x'\] not a data source"),
    (["toy_chain5", "toy_add"], r"\['toy_add'\] not a data source"),
    (["toy_chain5", "toy_chain5"], "named twice"),
    (["toy_chain6"], r"\['toy_chain6'\] not a data source of the toy task 'chain5_unsolved'"),  # +toy=chain6's
    (5, "a list of data sources"),
])
def test_train_sources_refused(bad, match):
    from verl_ext.config import ConfigError

    with pytest.raises(ConfigError, match=r"toy\.train_sources=.*" + match):
        toy_build.check_train_sources(bad)
    with pytest.raises(ConfigError, match=match):
        build_toy_assets(cache_dir="/nonexistent/never/built", verbose=False, train_sources=bad)  # before building
    assert toy_build.check_train_sources(["toy_add2"], task="add") == ("toy_add2",)  # each task's own sources


def test_toy_options_checked_at_start_up():
    """verl_ext.main.prepare refuses a bad toy node before anything is resolved, built or started."""
    from omegaconf import OmegaConf

    from verl_ext.config import ConfigError
    from verl_ext.main import check_toy_options

    def cfg(toy, train_files="${verl_ext_toy:train_parquet}"):
        c = OmegaConf.create({"data": {"train_files": train_files}})
        if toy is not None:
            c.toy = toy
        return c

    check_toy_options(cfg(None))  # the default: no toy node
    check_toy_options(cfg({"train_sources": ["toy_chain5"]}))
    check_toy_options(cfg({"train_sources": ["toy_chain6"]}, "${verl_ext_toy:train_parquet,chain6}"))  # +toy=chain6
    check_toy_options(cfg({"train_sources": ["toy_add"]}, "${verl_ext_toy:train_parquet,add}"))  # +toy=add
    for toy, train_files, match in (
        ({"train_sources": []}, "${verl_ext_toy:train_parquet}", "at least one"),
        ({"train_sources": ["toy_nope"]}, "${verl_ext_toy:train_parquet}", "not a data source"),
        ({"train_sources": ["toy_chain5"]}, "${verl_ext_toy:train_parquet,add}", "toy task 'add'"),
        ({"train_sources": ["toy_chain6"]}, "${verl_ext_toy:train_parquet}", "toy task 'chain5_unsolved'"),
        ({"train_source": ["toy_chain5"]}, "${verl_ext_toy:train_parquet}", "not a toy option"),
        ({"train_sources": ["toy_chain5"]}, "data/train.parquet", "embedded toy's training file"),
        ("add", "${verl_ext_toy:train_parquet}", "toy="),
    ):
        with pytest.raises(ConfigError, match=match):
            check_toy_options(cfg(toy, train_files))


def test_a_build_that_loses_the_rename_race_uses_the_winners(tmp_path, monkeypatch):
    """Two processes building the same toy cache (e.g. two test workers' first runs): the one whose rename comes
    second, after its ``root.exists()`` check saw nothing, returns the winner's complete build instead of failing."""

    def fake_build(into, **kwargs):  # what a complete build leaves
        (into / "model").mkdir()
        (into / "model" / "model.safetensors").write_bytes(b"w")
        for name in ("train.parquet", "val.parquet"):
            (into / name).write_bytes(b"p")
        (into / toy_build._MANIFEST).write_text(json.dumps({"task": "chain6", "winner": into.name}))
        return {"task": "chain6"}

    real_replace = os.replace

    def replace_after_the_winner(src, dst):  # the winner renames its build into place just before ours
        winner = Path(tempfile.mkdtemp(prefix="winner-", dir=str(tmp_path)))
        fake_build(winner)
        real_replace(winner, dst)
        monkeypatch.setattr(toy_build.os, "replace", real_replace)
        return real_replace(src, dst)

    monkeypatch.setattr(toy_build, "_build_into", fake_build)
    monkeypatch.setattr(toy_build.os, "replace", replace_after_the_winner)
    assets = toy_build._build_or_reuse(tmp_path, force=False, verbose=False, task="chain6", from_scratch=False)
    assert not assets.built and assets.stats["winner"].startswith("winner-")
    assert not any(p.name.startswith(".building-") for p in tmp_path.iterdir())  # our build was removed


def test_a_warm_up_takes_its_recipes_steps(tok):
    """The default toy's warm-up as its build runs it, with its recipe cut to 3 steps: it takes exactly those (the
    whole 1000-step warm-up against the packaged weights: tests/e2e/test_toy_build.py, on the CPU they were built on)."""
    import torch

    cell = toy_designs.parse_cell(toy_designs.REASON_TASKS[toy_build.DEFAULT_TASK], warmup_steps=3)
    with torch.random.fork_rng(devices=[]):
        _, sft = toy_build.warm_up(cell, tok)
    assert sft["sft_steps"] == 3 == cell.recipe["steps"]
    assert sft["sft_steps"] != toy_designs.reason_cell(toy_build.DEFAULT_TASK).recipe["steps"]


@pytest.mark.parametrize("reply, written", [
    ("3+5=8+5=13+7=20+2=22#22", 5),  # the whole solution
    ("3+5=8+5=13+7=20+2=23#23", 3),  # the last total wrong
    ("3+5=8+6=14+7=21+2=23#23", 1),  # the third operand misread: the hard split's common failure
    ("3+5=9+5=14+7=21+2=23#23", 0),  # the first total wrong
    ("3+5=8+5=131+7", 1),  # the second total's digits run on: not written as the solution writes it
    ("3+5=8+5=13+7=20+2=22", 4),  # every total, no answer
    ("", 0),
])
def test_first_departure_counts_the_totals_written_before_the_reply_leaves_the_solution(reply, written):
    assert toy_reason.first_departure(toy_reason.DATA_SOURCE_CHAIN, (3, 5, 5, 7, 2), reply) == written

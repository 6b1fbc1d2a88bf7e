"""Data preparation (verl_ext.data): DeepScaleR-style training parquet and the five evaluation suites, from
fixture files built here (the hub is unreachable), read back by verl's own RLHFDataset."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from verl_ext.data import deepscaler, eval_suites
from verl_ext.data.common import SYSTEM_PROMPT, DataError, load_records

TRAIN = [
    {"problem": "What is $2+3$?", "answer": "5", "correctness_rate": 0.0,
     "solution": "We add: $2+3=\\boxed{5}$."},
    {"problem": "Compute $\\frac{1}{2}+\\frac{1}{4}$.", "answer": "\\frac{3}{4}", "correctness_rate": 0.125,
     "solution": "Common denominator: $\\frac{2}{4}+\\frac{1}{4}=\\boxed{\\frac{3}{4}}$."},
    {"problem": "How many primes are below 10?", "answer": 4, "correctness_rate": 0.0},  # no solution
]


def write(path, records, fmt):
    if fmt == "json":
        path.write_text(json.dumps(records, indent=2))
    elif fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    else:  # a parquet column has one type
        pd.DataFrame([{k: str(v) if k == "answer" else v for k, v in r.items()} for r in records]).to_parquet(path)
    return str(path)


def toy_tokenizer():
    from verl_ext.toy.tokenizer import build_tokenizer

    return build_tokenizer()


def rlhf_items(files, tok):
    """Rows as verl's trainer reads them (RLHFDataset, chat template applied)."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    cfg = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 4096, "truncation": "error",
                            "filter_overlong_prompts": False, "return_raw_chat": True})
    ds = RLHFDataset(data_files=files, tokenizer=tok, config=cfg)
    return [ds[i] for i in range(len(ds))]


@pytest.mark.parametrize("fmt", ["json", "jsonl", "parquet"])
def test_deepscaler_training_parquet(tmp_path, fmt, capsys):
    src = write(tmp_path / f"train.{fmt}", TRAIN, fmt)
    assert deepscaler.main(["--input", src, "--output", str(tmp_path / "out")]) == 0
    assert "1 without a reference solution" in capsys.readouterr().out
    df = pd.read_parquet(tmp_path / "out" / "train.parquet")
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert set(df.data_source) == {"deepscaler_hard_1k"} and set(df.ability) == {"math"}
    row = df.iloc[1]
    assert [dict(m) for m in row.prompt] == [{"role": "system", "content": SYSTEM_PROMPT},
                                             {"role": "user", "content": TRAIN[1]["problem"]}]
    assert row.reward_model["ground_truth"] == "\\frac{3}{4}" and row.reward_model["style"] == "rule"
    assert df.iloc[2].reward_model["ground_truth"] == "4"  # numbers become strings
    assert row.extra_info["solution"] == TRAIN[1]["solution"] and row.extra_info["correctness_rate"] == 0.125
    assert df.iloc[2].extra_info["solution"] is None and [e["index"] for e in df.extra_info] == [0, 1, 2]


def test_deepscaler_rows_reach_gec_through_verls_dataset(tmp_path):
    from verl_ext.rollout.gec import ground_truth_text, reference_solution

    src = write(tmp_path / "train.json", TRAIN, "json")
    assert deepscaler.main(["--input", src, "--output", str(tmp_path)]) == 0
    items = rlhf_items([str(tmp_path / "train.parquet")], toy_tokenizer())
    assert reference_solution(items[0]["extra_info"], "solution") == TRAIN[0]["solution"]
    assert reference_solution(items[2]["extra_info"], "solution") is None  # GEC falls back to the answer
    assert ground_truth_text(items[1]["reward_model"]) == "\\frac{3}{4}"
    assert items[0]["raw_prompt"][0] == {"role": "system", "content": SYSTEM_PROMPT}


def test_deepscaler_options_and_errors(tmp_path, capsys):
    src = write(tmp_path / "t.jsonl", [{"question": "1+1?", "final_answer": ["2"], "ref": "so \\boxed{2}"}], "jsonl")
    out = tmp_path / "o"
    assert deepscaler.main(["--input", src, "--output", str(out), "--no-system-prompt", "--data-source", "mine",
                            "--solution-key", "ref", "--filename", "x.parquet"]) == 0
    row = pd.read_parquet(out / "x.parquet").iloc[0]
    assert [dict(m) for m in row.prompt] == [{"role": "user", "content": "1+1?"}]
    assert row.data_source == "mine" and row.reward_model["ground_truth"] == "2"
    assert row.extra_info["solution"] == "so \\boxed{2}"
    bad = write(tmp_path / "bad.json", [TRAIN[0], {"problem": "no answer here"}], "json")
    assert deepscaler.main(["--input", bad, "--output", str(out)]) == 2
    assert "record 1 has no answer" in capsys.readouterr().err
    assert deepscaler.main(["--input", str(tmp_path / "missing.csv"), "--output", str(out)]) == 2


def test_hf_dataset_name_is_loaded_with_its_split(tmp_path, monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return datasets.Dataset.from_list(TRAIN[:2])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert deepscaler.main(["--input", "someone/deepscaler-hard-1k", "--output", str(tmp_path)]) == 0
    assert calls == [("someone/deepscaler-hard-1k", None, "train")]
    assert len(pd.read_parquet(tmp_path / "train.parquet")) == 2

    def unreachable(*a, **k):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(DataError, match="not a local file, and loading it from the Hugging Face hub failed"):
        load_records("nobody/nothing")


# ---------------------------------------------------------------- evaluation suites


def suite_records(name, n):
    return [{"problem": f"{name} problem {i}", "answer": str(i)} for i in range(n)]


def test_eval_suites_from_the_originals_datasetdict(tmp_path, capsys):
    import datasets

    sizes = {"aime": 3, "amc": 2, "math": 4, "minerva": 1, "olympiad_bench": 2}
    dd = datasets.DatasetDict({k: datasets.Dataset.from_list(suite_records(k, n)) for k, n in sizes.items()})
    dd["gsm8k"] = datasets.Dataset.from_list(suite_records("gsm8k", 1))  # not a suite: skipped
    dd.save_to_disk(str(tmp_path / "evaluation_suite"))
    out = tmp_path / "eval"
    assert eval_suites.main(["--input", str(tmp_path / "evaluation_suite"), "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert "aime: 3 problems, the paper evaluated 30" in captured.err and "gsm8k" in captured.err
    assert "data.val_files=[" in captured.out
    assert sorted(os.listdir(out)) == sorted(f"{s.name}.parquet" for s in eval_suites.SUITES)
    items = rlhf_items([str(out / f"{s.name}.parquet") for s in eval_suites.SUITES], toy_tokenizer())
    by_source = {}
    for item in items:
        by_source.setdefault(item["data_source"], []).append(item)
    assert {k: len(v) for k, v in by_source.items()} == {
        "aime": 3, "amc": 2, "math500": 4, "minerva": 1, "olympiadbench": 2}
    first = by_source["math500"][0]
    assert first["raw_prompt"] == [{"role": "system", "content": SYSTEM_PROMPT},
                                   {"role": "user", "content": "math problem 0"}]
    assert first["reward_model"]["ground_truth"] == "0" and first["extra_info"]["split"] == "test"
    assert eval_suites.main(["--input", str(tmp_path / "evaluation_suite"), "--output", str(out),
                             "--strict-counts"]) == 2


def test_eval_suites_from_files_and_field_variants(tmp_path, capsys):
    folder = tmp_path / "files"
    folder.mkdir()
    write(folder / "AIME24.jsonl", [{"Problem": "p", "Answer": 204}], "jsonl")
    write(folder / "minerva_math.json",
          [{"problem": "m", "solution": "so the rate is $\\boxed{3.2 \\times 10^{5}}$."}], "json")
    oly = write(tmp_path / "oly.parquet", [{"question": "o", "final_answer": ["$\\frac{1}{2}$"]},
                                           {"question": "o2", "final_answer": ["$1$", "$2$"]}], "parquet")
    out = tmp_path / "eval"
    assert eval_suites.main(["--input", str(folder), "--suite", f"olympiadbench={oly}", "--output", str(out)]) == 0
    assert "not prepared: amc, math500" in capsys.readouterr().out
    gts = {s: list(pd.read_parquet(out / f"{s}.parquet").reward_model.map(lambda r: r["ground_truth"]))
           for s in ("aime", "minerva", "olympiadbench")}
    assert gts == {"aime": ["204"], "minerva": ["3.2 \\times 10^{5}"], "olympiadbench": ["\\frac{1}{2}", "1, 2"]}


@pytest.mark.parametrize("args,message", [
    (["--suite", "gsm8k=x.json"], "NAME one of"),
    (["--suite", "aime"], "expected NAME=SOURCE"),
    ([], "no suite found"),
])
def test_eval_suites_argument_errors(tmp_path, capsys, args, message):
    assert eval_suites.main(args + ["--output", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_eval_suite_record_without_answer(tmp_path, capsys):
    src = write(tmp_path / "amc.json", [{"problem": "p", "solution": "no box"}], "json")
    assert eval_suites.main(["--suite", f"amc={src}", "--output", str(tmp_path / "o")]) == 2
    assert "amc: record 0 has no answer" in capsys.readouterr().err


# ---------------------------------------------------------------- start-up checks of local data (verl_ext.data_checks)


def _gec(**kw):
    from verl_ext.config import GecConfig

    return GecConfig(enable=True, **kw).validate()


def _verl_parquet(path, ground_truths, row_group_size=None):
    """Rows as verl_ext.data writes them (chat prompt, reward_model struct, extra_info struct with a solution)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_ext.data.common import verl_row

    rows = [verl_row("math", f"q{i}", "5", "train", i, extra={"solution": None}) for i in range(len(ground_truths))]
    for row, gt in zip(rows, ground_truths):
        row["reward_model"]["ground_truth"] = gt
    pq.write_table(pa.Table.from_pylist(rows), str(path), row_group_size=row_group_size)
    return str(path)


@pytest.mark.parametrize("empty", ["", "  ", None])
def test_an_empty_ground_truth_is_missing(tmp_path, empty):
    from verl_ext.config import ConfigError
    from verl_ext.data_checks import check_gec_data, has_ground_truth

    assert not has_ground_truth({"ground_truth": empty}) and not has_ground_truth({"ground_truth": []})
    assert not has_ground_truth({"ground_truth": [""]})  # GEC injects the first element
    assert all(has_ground_truth({"ground_truth": gt}) for gt in ("5", 0, 0.0, ["5"], ["5", ""]))
    path = _verl_parquet(tmp_path / "t.parquet", ["5", empty, "7"])
    with pytest.raises(ConfigError, match=r"t\.parquet: 1 of 3 rows \(first: row 1\) have no reward_model\."):
        check_gec_data({"data": {"train_files": [path]}}, _gec())


def test_data_checks_read_by_row_groups_only_the_needed_fields(tmp_path, monkeypatch):
    """No whole-column read: the rows stream a row group at a time; the row number counts across row groups."""
    import pyarrow.parquet as pq

    from verl_ext.config import ConfigError
    from verl_ext.data_checks import check_gec_data

    path = _verl_parquet(tmp_path / "t.parquet", ["5"] * 250 + [""] + ["5"] * 49, row_group_size=100)
    assert pq.ParquetFile(path).num_row_groups == 3
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: pytest.fail("read a whole table"))
    read = []
    iter_batches = pq.ParquetFile.iter_batches

    def recording(self, *args, columns=None, **kwargs):
        read.append(list(columns))
        return iter_batches(self, *args, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)
    with pytest.raises(ConfigError, match=r"1 of 300 rows \(first: row 250\)"):
        check_gec_data({"data": {"train_files": [path]}}, _gec())
    assert read == [["reward_model.ground_truth"]]  # p_answer > 0: the solution is not needed


def test_with_gec_off_the_data_checks_read_no_rows(tmp_path, monkeypatch):
    """GEC off (the gec_agent loop still applies a row's sampling_params): what a parquet struct's schema shows
    settles it; rows are read only when the schema has an unknown sampling key."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_ext.config import ConfigError, GecConfig
    from verl_ext.data_checks import check_gec_data

    plain = _verl_parquet(tmp_path / "plain.parquet", ["5", ""])
    rows = [{"prompt": "q", "extra_info": {"sampling_params": {"temperature": 0.5, "temprature": None}}},
            {"prompt": "q", "extra_info": {"sampling_params": {"temperature": None, "temprature": 0.0}}}]
    typo = str(tmp_path / "typo.parquet")
    pq.write_table(pa.Table.from_pylist(rows), typo)
    known = str(tmp_path / "known.parquet")
    pq.write_table(pa.Table.from_pylist([{"prompt": "q", "extra_info": {"sampling_params": {"top_p": 0.9}}}]), known)
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: pytest.fail("read a whole table"))
    read = []
    iter_batches = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda self, *a, columns=None, **k: read.append(columns) or iter_batches(
                            self, *a, columns=columns, **k))
    check_gec_data({"data": {"train_files": [plain, known], "val_files": [plain, known]}}, GecConfig())
    assert read == []
    with pytest.raises(ConfigError, match=r"typo\.parquet: 1 of 2 rows set unknown .*\(row 1: \['temprature'\]\)"):
        check_gec_data({"data": {"val_files": [typo]}}, GecConfig())
    assert read == [["extra_info.sampling_params"]]

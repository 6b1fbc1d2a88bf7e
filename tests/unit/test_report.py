"""``python -m verl_ext.report`` on file-logger JSONL written here, in verl's FileLogger record format."""

import json
import math

import pytest

from verl_ext.report import FIGURES, find_runs, load_runs, main, resolve_panels, summary_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records))
    return path


def training_step(step, score, *, gepo=False, gec=True, data_source=None):
    data = {
        "critic/score/mean": score,
        "actor/pg_loss": 0.1 * step,
        "verl_ext/collapsed_group_frac": 0.5 / step,
        "verl_ext/adv_var": 0.8,
        "verl_ext/response_entropy_mean": 1.0 + 0.1 * step,
        "verl_ext/response_entropy_std": 0.2,
    }
    if gec:
        data.update({"gec/acc_before": score / 2, "gec/acc_after": score, "gec/count/reflect": 3.0,
                     "gec/count/answer": 1.0, "gec/count/solution": 0.0})
    if gepo:
        prefix = f"gepo/{data_source}" if data_source else "gepo"
        data.update({f"{prefix}/H_low": 0.9, f"{prefix}/H_high": 1.3, f"{prefix}/H_mean": 1.1,
                     f"{prefix}/frac_pos_attenuated": 0.1, f"{prefix}/frac_neg_attenuated": 0.05})
    return step, data


def validation(step, acc):
    return step, {"val-core/toy_add/acc/mean@8": acc, "val-core/openai/gsm8k/acc/mean@8": acc / 2}


def test_report_writes_figures_and_the_summary_of_two_runs(tmp_path, capsys):
    write_jsonl(tmp_path / "sweep/0_grpo/metrics.jsonl",
                [validation(0, 0.2)] + [training_step(s, 0.1 * s) for s in range(1, 7)] + [validation(6, 0.5)])
    write_jsonl(tmp_path / "sweep/1_gepo/metrics.jsonl",
                [training_step(s, 0.2, gepo=True, gec=False) for s in range(1, 5)])
    out = tmp_path / "out"
    assert main([str(tmp_path / "sweep"), "-o", str(out), "--last", "3"]) == 0
    for name in ["training", "validation", "step_diagnostics", "gepo", "gec"]:
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000, name
    printed = capsys.readouterr().out
    table = (out / "summary.md").read_text()
    assert table in printed
    header, _, grpo_row, gepo_row = table.splitlines()[:4]
    cols = [c.strip() for c in header.strip("|").split("|")]
    grpo = dict(zip(cols, (c.strip() for c in grpo_row.strip("|").split("|"))))
    gepo = dict(zip(cols, (c.strip() for c in gepo_row.strip("|").split("|"))))
    assert grpo["run"] == "0_grpo" and gepo["run"] == "1_gepo"
    assert float(grpo["reward"]) == pytest.approx((0.4 + 0.5 + 0.6) / 3, rel=1e-3)  # mean of the last 3 steps
    assert float(grpo["val toy_add"]) == 0.5 and float(grpo["val openai/gsm8k"]) == 0.25  # the last evaluation
    assert float(grpo["steps"]) == 6 and float(gepo["steps"]) == 4
    assert gepo["val toy_add"] == "—" and gepo["acc (before GEC)"] == "—"  # not logged by that run
    assert float(gepo["GEPO pos att."]) == pytest.approx(0.1) and grpo["GEPO pos att."] == "—"
    assert float(grpo["collapsed"]) == pytest.approx((0.5 / 4 + 0.5 / 5 + 0.5 / 6) / 3, rel=1e-3)  # 4 digits


def test_missing_metrics_are_skipped_not_errors(tmp_path, capsys):
    # verl's own metrics only: no verl_ext/, gepo/ or gec/ keys, no validation
    write_jsonl(tmp_path / "run/metrics.jsonl", [(s, {"critic/score/mean": 0.5, "actor/pg_loss": 0.0})
                                                 for s in range(1, 4)])
    assert main([str(tmp_path / "run")]) == 0
    out = tmp_path / "run" / "report"  # default: inside the single run folder
    assert (out / "training.png").exists() and (out / "summary.md").exists()
    for name in ["validation", "step_diagnostics", "gepo", "gec"]:
        assert not (out / f"{name}.png").exists()
    printed = capsys.readouterr().out
    assert "skipped gepo.png: no run logged its metrics" in printed
    assert "| run | steps | reward |" in printed


def test_per_data_source_panels_keep_slashes_in_the_source_name(tmp_path):
    write_jsonl(tmp_path / "r/metrics.jsonl", [training_step(1, 0.3, gepo=True, data_source="openai/gsm8k"),
                                               training_step(2, 0.3, gepo=True), validation(2, 0.4)])
    runs = load_runs([tmp_path / "r"])
    gepo_thresholds = next(p for f in FIGURES if f.name == "gepo" for p in f.panels)
    panels = dict(resolve_panels(gepo_thresholds, runs))
    assert set(panels) == {"group entropy (all)", "group entropy openai/gsm8k"}
    assert {line.name for line in panels["group entropy openai/gsm8k"]} == {"H_low", "H_high", "H_mean"}
    val = next(p for f in FIGURES if f.name == "validation" for p in f.panels)
    assert set(dict(resolve_panels(val, runs))) == {"val toy_add", "val openai/gsm8k"}


def test_resumed_segments_merge_and_bad_input_is_counted(tmp_path):
    run_dir = tmp_path / "run"
    write_jsonl(run_dir / "metrics.jsonl", [(s, {"critic/score/mean": 0.1}) for s in range(1, 6)])
    write_jsonl(run_dir / "metrics.1.jsonl", [(s, {"critic/score/mean": 0.9}) for s in range(4, 8)])
    with open(run_dir / "metrics.1.jsonl", "a") as f:
        f.write('{"step": 8, "data": {"critic/sco')  # a run killed mid-write
        f.write('\n{"step": 9, "data": {"critic/score/mean": null, "note": "text"}}\n')
    # other JSONL in the tree (verl's rollout dumps) are not runs
    (run_dir / "rollouts").mkdir()
    (run_dir / "rollouts" / "1.jsonl").write_text('{"input": "1+1=?", "output": "2", "score": 1.0}\n')
    [(source, files)] = find_runs(tmp_path)
    assert source == run_dir and [f.name for f in files] == ["metrics.jsonl", "metrics.1.jsonl"]
    [run] = load_runs([tmp_path])
    steps, values = run.series("critic/score/mean")
    assert steps == [1, 2, 3, 4, 5, 6, 7] and values == [0.1, 0.1, 0.1, 0.9, 0.9, 0.9, 0.9]  # step 9: NaN, dropped
    assert math.isnan(run.steps[9]["critic/score/mean"]) and "note" not in run.steps[9]
    assert run.bad_lines == 1


def test_a_jsonl_file_is_a_run_and_nothing_found_is_a_clear_error(tmp_path, capsys):
    path = write_jsonl(tmp_path / "verl_ext" / "toy_grpo.jsonl", [training_step(1, 0.5)])
    write_jsonl(tmp_path / "verl_ext" / "toy_gepo.jsonl", [training_step(1, 0.5, gepo=True)])
    runs = load_runs([tmp_path / "verl_ext"])
    assert [r.label for r in runs] == ["toy_gepo", "toy_grpo"]  # verl's default layout: one file per experiment
    assert len(load_runs([tmp_path / "verl_ext", path])) == 2  # named twice, drawn once
    assert "| run | steps |" in summary_table(load_runs([path]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "empty")])
    assert "no verl file-logger JSONL" in capsys.readouterr().err


def test_by_method_rows_average_seeds_and_all_wrong_groups_are_a_column(tmp_path, capsys):
    def run(method, seed, acc, all_wrong):
        steps = [(s, {**training_step(s, 0.5)[1], "verl_ext/toy_add2/groups_all_wrong_frac": all_wrong})
                 for s in range(1, 4)]
        write_jsonl(tmp_path / f"toy/toy_{method}_seed{seed}/metrics.jsonl", steps + [validation(3, acc)])

    run("grpo", 1, 0.4, 1.0)
    run("grpo", 2, 0.6, 0.8)
    run("edge_grpo", 1, 0.3, 0.2)
    out = tmp_path / "out"
    assert main([str(tmp_path / "toy"), "-o", str(out), "--by-method", "--last", "2"]) == 0
    table = (out / "summary.md").read_text()
    by_method = table[table.index("| method"):].splitlines()
    cols = [c.strip() for c in by_method[0].strip("|").split("|")]
    rows = {r["method"]: r for r in (dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
                                     for line in by_method[2:4])}
    assert set(rows) == {"toy_grpo", "toy_edge_grpo"}
    assert rows["toy_grpo"]["seeds"] == "2" and rows["toy_edge_grpo"]["seeds"] == "1"
    assert rows["toy_grpo"]["val toy_add"] == "0.500 [0.400–0.600]"  # mean over seeds [min–max]
    assert rows["toy_grpo"]["all-wrong toy_add2"] == "0.900 [0.800–1.000]"
    assert rows["toy_edge_grpo"]["all-wrong toy_add2"] == "0.200"

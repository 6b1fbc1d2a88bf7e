"""``python -m verl_ext.report`` on file-logger JSONL written here, in verl's FileLogger record format."""

import json
import math
import random
from pathlib import Path

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


# ---- the figures read at a glance ----------------------------------------------------------------------------------
BRANCHES = ("none", "reflect", "answer", "solution", "solution_fallback", "solution_too_long", "gated",
            "answer_no_room", "too_short", "no_ground_truth", "group_not_all_wrong")
FIRED = ("none", "reflect", "answer", "too_short")  # the demo's branches that fire; the other 7 stay at 0


def demo_like_run(path, steps=60, seed=0):
    """The shape of the demo's metrics: three data sources validated sampled and greedy at the first and last step
    (``toy_bag`` 0.1812 -> 0.1800: one held-out sample; ``toy_chain6``'s greedy copy right on none), a noisy
    all-wrong share drifting down, 11 GEC branches of which 7 never fire."""
    rng = random.Random(seed)
    records = []
    for step in range(steps + 1):
        data = {}
        if step in (0, steps):
            late = step == steps
            for source, (start, end) in {"toy_bag": (0.1812, 0.18), "toy_chain": (0.30, 0.42),
                                         "toy_chain6": (0.05, 0.09)}.items():
                data[f"val-core/{source}/acc/mean@1"] = end if late else start
                data[f"val-core/{source}@greedy/acc/mean@1"] = 0.0 if source == "toy_chain6" else (
                    end if late else start) + 0.04
        if step:
            data["verl_ext/toy_bag/groups_all_wrong_frac"] = max(0.0, 0.8 - 0.004 * step + rng.uniform(-0.2, 0.2))
            data["critic/score/mean"] = 0.3 + rng.uniform(-0.1, 0.1)
            data.update({f"gec/count/{b}": float(rng.randint(1, 9)) if b in FIRED else 0.0 for b in BRANCHES})
            data.update({"gec/acc_before": 0.25, "gec/acc_after": 0.6})
        records.append((step, data))
    return write_jsonl(path, records)


@pytest.fixture
def saved_figures(monkeypatch):
    """{figure name: the matplotlib figure the report saved}, to read what a PNG shows."""
    from matplotlib.figure import Figure

    figures, savefig = {}, Figure.savefig

    def save(self, fname, *args, **kwargs):
        figures[Path(fname).stem] = self
        return savefig(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", save)
    return figures


def shown_axes(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


def legend_of(ax):
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def test_a_sources_sampled_and_greedy_accuracy_share_a_panel_on_the_unit_range(tmp_path, saved_figures):
    demo_like_run(tmp_path / "run/metrics.jsonl")
    assert main([str(tmp_path / "run"), "-o", str(tmp_path / "out")]) == 0
    axes = shown_axes(saved_figures["validation"])
    assert sorted(ax.get_title() for ax in axes) == ["val toy_bag", "val toy_chain", "val toy_chain6"]
    for ax in axes:
        # both drawn, toy_chain6's greedy accuracy of 0 too: a validation point is a result, not an idle series
        assert [text.rsplit(" · ", 1)[-1] for text in legend_of(ax)] == ["sampled", "greedy"], ax.get_title()
        low, high = ax.get_ylim()
        assert -0.05 <= low <= 0.0 and 1.0 <= high <= 1.05, (ax.get_title(), low, high)  # accuracies: all of [0, 1]
    bag = next(ax for ax in axes if ax.get_title() == "val toy_bag")
    assert sorted(list(line.get_ydata()) for line in bag.get_lines()) == [[0.1812, 0.18], [0.2212, 0.22]]


def test_a_noisy_step_metric_gets_its_smoothed_line_beside_the_raw_one(tmp_path, saved_figures):
    demo_like_run(tmp_path / "run/metrics.jsonl")
    [run] = load_runs([tmp_path / "run"])
    _, raw = run.series("verl_ext/toy_bag/groups_all_wrong_frac")
    assert main([str(tmp_path / "run"), "-o", str(tmp_path / "out")]) == 0
    [all_wrong] = [ax for ax in shown_axes(saved_figures["step_diagnostics"]) if "all-wrong" in ax.get_title()]
    assert len(all_wrong.get_lines()) == 2 and list(all_wrong.get_lines()[0].get_ydata()) == raw  # raw + smoothed

    from verl_ext.report import DEFAULT_SMOOTHING, ema_smooth

    for smoothing, expected in [(None, ema_smooth(raw, DEFAULT_SMOOTHING)), ("0.5", ema_smooth(raw, 0.5)),
                                ("0", None)]:
        out = tmp_path / f"out{smoothing}"
        assert main([str(tmp_path / "run"), "-o", str(out)] + (["--smoothing", smoothing] if smoothing else [])) == 0
        [all_wrong] = [ax for ax in shown_axes(saved_figures["step_diagnostics"]) if "all-wrong" in ax.get_title()]
        drawn = [list(line.get_ydata()) for line in all_wrong.get_lines()]
        assert drawn == ([raw, expected] if expected else [raw]), smoothing
        assert len(legend_of(all_wrong)) == 1  # one entry per series, not one per line drawn
    with pytest.raises(SystemExit):
        main([str(tmp_path / "run"), "--smoothing", "1"])


def test_series_zero_throughout_are_named_not_drawn_and_no_two_series_share_a_colour(tmp_path, saved_figures):
    from matplotlib.colors import to_hex

    demo_like_run(tmp_path / "run/metrics.jsonl")
    assert main([str(tmp_path / "run"), "-o", str(tmp_path / "out")]) == 0
    [branches] = [ax for ax in shown_axes(saved_figures["gec"]) if ax.get_title().startswith("branches")]
    assert sorted(legend_of(branches)) == sorted(FIRED)
    assert len({to_hex(line.get_color()) for line in branches.get_lines()}) == len(FIRED)
    [note] = [t.get_text() for t in branches.texts if "zero throughout" in t.get_text()]
    assert sorted(note.splitlines()[1:]) == sorted(set(BRANCHES) - set(FIRED))
    # twelve runs in one panel: twelve colours
    for i in range(12):
        demo_like_run(tmp_path / f"sweep/{i}_run/metrics.jsonl", seed=i)
    assert main([str(tmp_path / "sweep"), "-o", str(tmp_path / "sweep_out"), "--smoothing", "0"]) == 0
    [reward] = [ax for ax in shown_axes(saved_figures["training"]) if ax.get_title().startswith("reward")]
    assert len(legend_of(reward)) == 12 and len({to_hex(line.get_color()) for line in reward.get_lines()}) == 12


def test_ema_smooth_is_tensorboards_debiased_moving_average():
    from verl_ext.report import ema_smooth

    assert ema_smooth([1.0, 0.0, 0.0], 0.5) == pytest.approx([1.0, 1 / 3, 1 / 7])  # 0.5/0.5, 0.25/0.75, 0.125/0.875
    assert ema_smooth([2.0] * 5, 0.9) == pytest.approx([2.0] * 5)  # debiased: a constant stays put from the start
    assert ema_smooth([0.3, 0.9, 0.1], 0.0) == [0.3, 0.9, 0.1]
    assert ema_smooth([], 0.6) == []
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        ema_smooth([1.0], 1.0)


def test_y_limits_never_magnify_one_sample():
    from verl_ext.report import UNIT, y_limits

    low, high = y_limits([0.1812, 0.18], UNIT)
    assert high - low >= 0.1 and low <= 0.18 - 0.05 and high >= 0.1812 + 0.05
    low, high = y_limits([0.0, 0.0, 0.01], UNIT)  # cut at 0: still 0.1 tall, a thin margin under the bound
    assert -0.01 < low < 0.0 and high >= 0.1
    low, high = y_limits([0.97, 1.0], UNIT)
    assert 1.0 < high < 1.01 and low <= 0.9
    low, high = y_limits([0.4, 0.5], UNIT, whole_range=True)
    assert -0.05 < low < 0.0 and 1.0 < high < 1.05
    assert y_limits([10.0, 20.0]) == pytest.approx((9.5, 20.5))  # 5% of the range when it exceeds 0.05
    assert y_limits([]) is None and y_limits([math.nan]) is None


def test_distinct_colours_never_repeat():
    from verl_ext.report import distinct_colours

    for n in range(1, 41):
        assert len(set(distinct_colours(n))) == n, n
    assert distinct_colours(2) == ["#1f77b4", "#ff7f0e"]  # matplotlib's first two

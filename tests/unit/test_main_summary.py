"""What ``python -m verl_ext.main`` prints at its end (``verl_ext.main.run_summary``): held-out accuracy per data
source at the first and the last validation, and the report command for the run; on synthetic metrics."""

from __future__ import annotations

import json
import math
import os

from verl_ext.main import print_run_summary, run_metrics_file, run_summary, start_end_table
from verl_ext.metrics_file import read_steps


def _toy_steps() -> dict[int, dict[str, float]]:
    """Metrics shaped as the toy writes them: validation at steps 0 and 60, training metrics in between."""
    val0 = {"val-core/toy_chain/acc/mean@1": 0.876, "val-core/toy_chain@greedy/acc/mean@1": 1.0,
            "val-core/toy_bag/acc/mean@1": 0.177, "val-core/toy_bag@greedy/acc/mean@1": 0.23,
            "val-core/toy_chain6/acc/mean@1": 0.005, "val-core/toy_chain6@greedy/acc/mean@1": 0.01,
            "val-core/toy_chain/reward/mean@1": 0.876, "val-aux/toy_chain/acc/std@1": 0.3}
    val60 = {"val-core/toy_chain/acc/mean@1": 0.203, "val-core/toy_chain@greedy/acc/mean@1": 0.71,
             "val-core/toy_bag/acc/mean@1": 0.154, "val-core/toy_bag@greedy/acc/mean@1": 0.17,
             "val-core/toy_chain6/acc/mean@1": 0.025, "val-core/toy_chain6@greedy/acc/mean@1": 0.01}
    steps = {0: val0}
    for s in range(1, 61):
        steps[s] = {"critic/score/mean": 0.3, "gec/acc_before": 0.3}
    steps[60].update(val60)
    return steps


def test_start_end_table_of_the_toy():
    table = start_end_table(_toy_steps())
    lines = table.splitlines()
    assert lines[0] == ("| held-out | `toy_chain` sampled / greedy | `toy_bag` sampled / greedy "
                        "| `toy_chain6` sampled / greedy |")  # the data sources in the order the run logged them
    assert lines[2] == "| step 0 | 0.876 / 1.000 | 0.177 / 0.230 | 0.005 / 0.010 |"
    assert lines[3] == "| step 60 | 0.203 / 0.710 | 0.154 / 0.170 | 0.025 / 0.010 |"
    assert lines[4] == "(val-core/<data source>/acc/mean@1)"
    assert len(lines) == 5


def test_start_end_table_other_runs():
    assert start_end_table({}) is None
    assert start_end_table({1: {"critic/score/mean": 0.5}, 2: {"critic/score/mean": 0.6}}) is None  # no validation
    # one validation only (no val_before_train): one row; a source whose reward logs no acc: its reward/mean@N;
    # a source missing from a validation: a dash; no greedy copies: one figure per cell
    one = start_end_table({5: {"val-core/aime/reward/mean@4": 0.25, "val-core/math500/acc/mean@4": 0.5}})
    assert one.splitlines()[2] == "| step 5 | 0.250 | 0.500 |" and len(one.splitlines()) == 4
    assert "acc/mean@4, reward/mean@4" in one
    three = start_end_table({0: {"val-core/a/acc/mean@1": 0.1}, 5: {"val-core/a/acc/mean@1": 0.2},
                             10: {"val-core/a/acc/mean@1": 0.3, "val-core/b/acc/mean@1": math.nan}})
    assert [r.split(" | ")[0] for r in three.splitlines()[2:4]] == ["| step 0", "| step 10"]  # first and last
    assert three.splitlines()[2] == "| step 0 | 0.100 | — |" and three.splitlines()[3] == "| step 10 | 0.300 | — |"


def test_run_summary_names_the_report_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "outputs" / "toy_edge_grpo" / "20250101-000000"
    text = run_summary(_toy_steps(), str(run / "metrics.jsonl"))
    assert text.splitlines()[0] == "[verl_ext] held-out accuracy, start → end:"
    assert text.splitlines()[-1] == "[verl_ext] the run's report: python -m verl_ext.report " \
                                    + os.path.join("outputs", "toy_edge_grpo", "20250101-000000")
    # no validation logged: the command only; verl's default file (not a run folder's metrics.jsonl): that file
    assert run_summary({}, str(run / "metrics.1.jsonl")).splitlines() == [
        "[verl_ext] the run's report: python -m verl_ext.report " + os.path.join("outputs", "toy_edge_grpo",
                                                                                 "20250101-000000")]
    assert run_summary({}, "/elsewhere/verl_ext/toy.jsonl").endswith("python -m verl_ext.report /elsewhere/verl_ext/toy.jsonl")


def test_print_run_summary_reads_the_metrics_file(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        for step, data in sorted(_toy_steps().items()):
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    assert read_steps(path)[0] == _toy_steps()
    print_run_summary(str(path))
    out = capsys.readouterr().out
    assert "| step 60 | 0.203 / 0.710 | 0.154 / 0.170 | 0.025 / 0.010 |" in out and "verl_ext.report" in out
    print_run_summary(str(tmp_path / "missing.jsonl"))  # no file here (other loggers, a remote TaskRunner): silent
    print_run_summary(None)
    assert capsys.readouterr().out == ""


def test_run_metrics_file(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    def cfg(**trainer):
        return OmegaConf.create({"trainer": {"project_name": "p", "experiment_name": "e", **trainer}})

    path = tmp_path / "metrics.jsonl"
    assert run_metrics_file(cfg(logger=["console"], file_logger_path=str(path))) is None
    assert run_metrics_file(cfg(logger=["console", "file"], file_logger_path=str(path))) == str(path)
    path.write_text('{"step": 0, "data": {}}\n')  # a run resumed into the folder writes the next free file
    assert run_metrics_file(cfg(logger="file", file_logger_path=str(path))) == str(tmp_path / "metrics.1.jsonl")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VERL_FILE_LOGGER_ROOT", raising=False)
    assert run_metrics_file(cfg(logger=["file"], file_logger_path=None)) == str(tmp_path / "p" / "e.jsonl")


def test_a_run_names_its_trainer_and_the_demo_runs_verls_v1():
    from verl_ext.dry_run import compose_run_config
    from verl_ext.main import trainer_line

    assert trainer_line(compose_run_config("toy_cpu", [])) == (
        "[verl_ext] trainer: verl's v1 trainer, sync mode (trainer.use_v1=true)")
    assert "colocate_async mode" in trainer_line(compose_run_config("toy_cpu", ["trainer.v1.trainer_mode=colocate_async"]))
    legacy = trainer_line(compose_run_config("toy_cpu", ["trainer.use_v1=false"]))
    assert "legacy RayPPOTrainer" in legacy and "deprecated" in legacy

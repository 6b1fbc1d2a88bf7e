"""Every script under examples/ dry-runs (DRY_RUN=1): the real config is composed, resolved and passes verl_ext's and
verl's start-up checks (python -m verl_ext.dry_run), and the printed config holds what the script promises (the
paper row's estimator and GEC mode, n, batch, model, names, loggers, output paths). A required variable that is unset
stops the script with one line naming it; an invalid override fails the dry run as it would fail a run.

The scripts run with a recording interpreter and their calls are composed in this process (one import of verl for
all); three run the real interpreter end to end (test_scripts_run_the_real_dry_run_module).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SEED = "7"
LIBRARIES = {"common.sh", "defaults.sh"}  # sourced by the scripts, never run

# the EDGE-GRPO paper's rows: adv_estimator, GEC on, GEC mode, data.max_response_length
EDGE_ROWS = {
    "grpo": ("grpo", False, None, 1024),  # nothing caps the first generation without GEC: the original's 1024
    "force_r": ("grpo", True, "force_reflect", 1287),
    "force_r_eda": ("edge_grpo", True, "force_reflect", 1287),
    "edge_grpo": ("edge_grpo", True, "gec", 1287),
    # beside the rows: prompt-side hints in Scaf-GRPO's and GHPO's scopes (issue 56), with a hint's prompt room
    "grpo_hint": ("grpo", True, "hint", 1024),
    "grpo_hint_all": ("grpo", True, "hint", 1024),
}
HINT_ROW_KEYS = {"algorithm.gec.hint_placement": "user", "algorithm.gec.hint_rule": "math",
                 "data.max_prompt_length": 1024, "algorithm.gec.hint_levels": [0.25, 0.5, 0.75]}
SUITES = ("aime", "amc", "math500", "minerva", "olympiadbench")
MIXTURE_ENV = {"MODEL": "/placeholder/models/mix-8b",
               "TRAIN_FILES": "/placeholder/math.parquet,/placeholder/code.parquet",
               "VAL_FILES": "/placeholder/math_val.parquet,/placeholder/code_val.parquet"}


@dataclass
class Case:
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    expect: list[dict] = field(default_factory=list)  # one {dotted key: value} per job the script runs
    required: tuple[str, ...] = ()  # variables the script refuses to run without (${NAME:?...})


def run_paths(project: str, name: str, out: str) -> dict:
    run_dir = f"{out}/{project}/{name}"
    return {"trainer.project_name": project, "trainer.experiment_name": name,
            "trainer.default_local_dir": f"{run_dir}/checkpoints",
            "trainer.validation_data_dir": f"{run_dir}/validation",
            "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH": f"{run_dir}/metrics.jsonl",
            "data.seed": int(SEED), "actor_rollout_ref.rollout.seed": int(SEED)}


def edge_expect(row: str, model: str, batch: str, out: str, **extra) -> dict:
    estimator, gec, mode, length = EDGE_ROWS[row]
    tag = model.rstrip("/").rsplit("/", 1)[-1]
    exp = {"algorithm.adv_estimator": estimator, "algorithm.gec.enable": gec, "data.max_response_length": length,
           "actor_rollout_ref.model.path": model, "actor_rollout_ref.rollout.n": 8,
           "actor_rollout_ref.rollout.temperature": 0.6, "actor_rollout_ref.rollout.name": "vllm",
           "actor_rollout_ref.actor.optim.lr": 1e-6, "actor_rollout_ref.actor.optim.lr_scheduler_type": "linear",
           "data.train_batch_size": 16 if batch == "throughput" else 1,
           "actor_rollout_ref.actor.ppo_mini_batch_size": 16 if batch == "throughput" else 1,
           "trainer.test_freq": 6 if batch == "throughput" else 100,
           "trainer.save_freq": 16 if batch == "throughput" else 250,
           "reward.custom_reward_function.path": "pkg://verl_ext.rewards.math",
           "reward.custom_reward_function.reward_kwargs.scale": "original",
           "data.train_files": "data/train/train.parquet",
           "data.val_files": [f"data/eval/{s}.parquet" for s in SUITES],
           "trainer.n_gpus_per_node": 8, "trainer.nnodes": 1, "trainer.logger": ["console", "file"],
           **run_paths("verl_ext_edge_grpo", f"{row}_{tag}_{batch}_seed{SEED}", out)}
    if mode:
        exp["algorithm.gec.mode"] = mode
    if mode == "hint":
        exp.update(HINT_ROW_KEYS, **{"algorithm.gec.hint_scope": "all" if row.endswith("_all") else "one"})
    exp.update(extra)
    return exp


def gepo_expect(task: str, method: str, model: str, out: str, **extra) -> dict:
    tag = model.rstrip("/").rsplit("/", 1)[-1]
    exp = {"algorithm.adv_estimator": "grpo" if method == "grpo" else "gepo", "algorithm.gec.enable": False,
           "actor_rollout_ref.model.path": model, "actor_rollout_ref.rollout.n": 16, "data.train_batch_size": 16,
           "actor_rollout_ref.actor.ppo_mini_batch_size": 16, "actor_rollout_ref.actor.use_kl_loss": False,
           "algorithm.gepo.alpha_low": 0.5, "algorithm.gepo.alpha_high": 0.2,
           "data.max_response_length": 1024, "trainer.total_epochs": 3, "trainer.n_gpus_per_node": 8,
           "trainer.logger": ["console", "file"],
           **run_paths("verl_ext_gepo", f"{task}_{method}_{tag}_seed{SEED}", out)}
    if method != "grpo":
        exp["algorithm.gepo.stats_scope"] = "per_data_source" if method == "gepo_per_source" else "global"
    if task == "math":
        exp.update({"reward.custom_reward_function.path": "pkg://verl_ext.rewards.math",
                    "data.train_files": ["data/train/train.parquet"],
                    "data.val_files": [f"data/eval/{s}.parquet" for s in SUITES]})
    else:
        exp.update({"reward.custom_reward_function.path": None,  # verl's built-in scoring per data_source
                    "data.train_files": MIXTURE_ENV["TRAIN_FILES"].split(","),
                    "data.val_files": MIXTURE_ENV["VAL_FILES"].split(",")})
    exp.update(extra)
    return exp


# the toy methods of examples/common.sh beyond the estimator and GEC switch: what each sets
TOY_METHOD_KEYS = {
    "gec_answer": {"algorithm.gec.p_reflect": 0, "algorithm.gec.p_answer": 1, "algorithm.gec.p_solution": 0},
    "gec_solution": {"algorithm.gec.p_reflect": 0, "algorithm.gec.p_answer": 0, "algorithm.gec.p_solution": 1},
    "gec_reflect_answer": {"algorithm.gec.p_reflect": 0.5, "algorithm.gec.p_answer": 0.5, "algorithm.gec.p_solution": 0},
    "gec_reflect_solution": {"algorithm.gec.p_reflect": 0.5, "algorithm.gec.p_answer": 0,
                             "algorithm.gec.p_solution": 0.5},
    "edge_grpo_masked": {"algorithm.gec.mask_injected": True},
    "edge_grpo_scope": {"algorithm.gec.edit_scope": "all_wrong_groups"},
    "edge_grpo_before": {"algorithm.gec.prefix_advantage": "before"},
    "edge_grpo_zero": {"algorithm.gec.prefix_advantage": "zero"},
    "edge_grpo_shaped": {"algorithm.gec.injected_loss": "shaped"},
    "edge_grpo_credit": {"algorithm.gec.edit_scope": "all_wrong_groups", "algorithm.gec.prefix_advantage": "before",
                         "algorithm.gec.injected_loss": "shaped"},
    "edge_grpo_scope_shaped": {"algorithm.gec.edit_scope": "all_wrong_groups", "algorithm.gec.injected_loss": "shaped"},
    "eda_grad": {"algorithm.edge_grpo.entropy_grad": True},
    "edge_grpo_grad": {"algorithm.edge_grpo.entropy_grad": True},
    "gepo_per_source": {"algorithm.gepo.stats_scope": "per_data_source"},
    "edge_grpo_guard": {"algorithm.gec.min_own_tokens": 1},
    "grpo_hint": {"algorithm.gec.mode": "hint", "algorithm.gec.hint_scope": "one"},
    "grpo_hint_all": {"algorithm.gec.mode": "hint", "algorithm.gec.hint_scope": "all"},
    "edge_grpo_hint": {"algorithm.gec.mode": "hint", "algorithm.gec.hint_scope": "one"},
    "grpo_hint_low": {"algorithm.gec.mode": "hint", "algorithm.gec.hint_scope": "all", "algorithm.gec.hint_levels": [0.25]},
}


def toy_expect(method: str, seed: str, steps: int, out: str) -> dict:
    estimator = {"grpo": "grpo", "grpo_gec": "grpo", "gepo": "gepo", "gepo_per_source": "gepo", "grpo_hint": "grpo",
                 "grpo_hint_all": "grpo", "grpo_hint_low": "grpo"}.get(method, "edge_grpo")
    paths = run_paths("verl_ext_toy", f"toy_{method}_seed{seed}", out)
    paths.update({"data.seed": int(seed), "actor_rollout_ref.rollout.seed": int(seed)})
    exp = {"algorithm.adv_estimator": estimator,
           "algorithm.gec.enable": method not in ("grpo", "eda", "gepo", "gepo_per_source", "eda_grad"),
           "algorithm.gec.min_own_tokens": 0, "algorithm.gec.edit_scope": "all",
           "algorithm.gec.prefix_advantage": "after", "algorithm.gec.injected_loss": "policy",
           "trainer.device": "cpu", "actor_rollout_ref.rollout.name": "hf", "actor_rollout_ref.rollout.n": 8,
           "trainer.total_training_steps": steps, "trainer.logger": ["console", "file"], **paths}
    exp.update(TOY_METHOD_KEYS.get(method, {}))
    return exp


def cases(out: str) -> dict[str, Case]:
    c: dict[str, Case] = {}
    for size in ("1.5B", "7B"):
        for row in EDGE_ROWS:
            if EDGE_ROWS[row][2] == "hint" and size != "7B":
                continue  # the hint scripts are for Scaf-GRPO's and GHPO's model
            c[f"edge_grpo/qwen2.5-math-{size.lower()}/{row}.sh"] = Case(
                expect=[edge_expect(row, f"Qwen/Qwen2.5-Math-{size}", "throughput", out)])
    # a row script with every variable set: the paper's batch, another model, extra overrides last (they win)
    c["edge_grpo/qwen2.5-math-1.5b/edge_grpo.sh"] = Case(
        env={"BATCH": "paper", "MODEL": "/placeholder/models/my-model/", "TRAIN_FILE": "/placeholder/train.parquet",
             "VAL_DIR": "/placeholder/eval", "N_GPUS": "4", "NNODES": "2"},
        args=("algorithm.edge_grpo.entropy_grad=true", "data.max_response_length=2048"),
        expect=[edge_expect("edge_grpo", "/placeholder/models/my-model/", "paper", out,
                            **{"data.train_files": "/placeholder/train.parquet",
                               "data.val_files": [f"/placeholder/eval/{s}.parquet" for s in SUITES],
                               "trainer.n_gpus_per_node": 4, "trainer.nnodes": 2,
                               "algorithm.edge_grpo.entropy_grad": True, "data.max_response_length": 2048})])
    for method in ("grpo", "gepo"):
        c[f"gepo/math_{method}.sh"] = Case(expect=[gepo_expect("math", method, "Qwen/Qwen2.5-Math-7B", out)])
    required = ("MODEL", "TRAIN_FILES", "VAL_FILES")
    for method in ("grpo", "gepo", "gepo_per_source"):
        c[f"gepo/mixture_{method}.sh"] = Case(env=dict(MIXTURE_ENV), required=required,
                                              expect=[gepo_expect("mixture", method, MIXTURE_ENV["MODEL"], out)])
    c["gepo/mixture_gepo.sh"].env["WANDB_API_KEY"] = "placeholder"  # wandb joins the loggers when its key is set
    c["gepo/mixture_gepo.sh"].expect[0]["trainer.logger"] = ["console", "file", "wandb"]
    c["gepo/mixture_gepo_per_source.sh"] = Case(
        env={**MIXTURE_ENV, "REWARD_PATH": "/placeholder/reward.py", "EPOCHS": "1"}, required=required,
        expect=[gepo_expect("mixture", "gepo_per_source", MIXTURE_ENV["MODEL"], out,
                            **{"reward.custom_reward_function.path": "/placeholder/reward.py",
                               "trainer.total_epochs": 1})])
    c["toy/train.sh"] = Case(expect=[toy_expect("edge_grpo", SEED, 60, out)])
    # the sweep with the other methods of common.sh (the comparison's are below)
    others = ("gepo_per_source", *(m for m in TOY_METHOD_KEYS if m not in ("gepo_per_source", "edge_grpo_guard")))
    c["toy/sweep.sh"] = Case(env={"METHODS": " ".join(others), "SEEDS": "3 4", "STEPS": "5"},
                             expect=[toy_expect(m, s, 5, out) for s in ("3", "4") for m in others])
    # the comparison: the same seeds for every method, one seed's methods after another (JOBS=1)
    # its default METHODS: the six of the first comparison round (docs/toy-research.md), the guard's row included
    c["toy/compare.sh"] = Case(env={"SEEDS": "3 4", "STEPS": "5"},
                               expect=[toy_expect(m, s, 5, out) for s in ("3", "4")
                                       for m in ("grpo", "eda", "grpo_gec", "edge_grpo", "gepo", "edge_grpo_guard")])
    return c


def scripts() -> list[str]:
    return sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.sh") if p.name not in LIBRARIES)


def script_env(tmp: Path, extra: dict[str, str], python: str = sys.executable) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VERL_PLATFORM", "WANDB_API_KEY", "RUN_DIR", "MODEL", "SEED", "DRY_RUN")}
    env.update(PYTHON=python, DRY_RUN="1", SEED=SEED, OUTPUT_ROOT=str(tmp / "out"),
               PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
               TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def run_script(script: str, env: dict[str, str], args=(), cwd: Path = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXAMPLES / script), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=600)


# Stands in for the interpreter: records each call's arguments (NUL-separated, one numbered file per call), so the
# scripts run in a fraction of a second and the configs are composed in this process (one import of verl for all);
# test_scripts_run_the_real_dry_run_module runs the interpreter itself.
RECORDER = """#!/usr/bin/env bash
n=$(ls "$RECORD_DIR" | wc -l)
printf '%s\\0' "$@" > "$RECORD_DIR/$(printf %03d "$n")"
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """{script: (CompletedProcess, [python arguments of each call], Case, tmp)}: every script with DRY_RUN=1, run in
    an empty working directory with the recording interpreter."""
    tmp = tmp_path_factory.mktemp("examples")
    (tmp / "cwd").mkdir()
    recorder = tmp / "python"
    recorder.write_text(RECORDER)
    recorder.chmod(0o755)
    all_cases = cases(str(tmp / "out"))
    results = {}
    for i, script in enumerate(s for s in scripts() if s in all_cases):
        record = tmp / f"record{i}"
        record.mkdir()
        case = all_cases[script]
        proc = run_script(script, script_env(tmp, {**case.env, "RECORD_DIR": str(record)}, str(recorder)),
                          case.args, tmp / "cwd")
        calls = [f.read_bytes().decode().split("\0")[:-1] for f in sorted(record.iterdir())]
        results[script] = (proc, calls, case, tmp)
    return results


def test_every_script_has_a_case_and_the_house_style():
    found = scripts()
    assert len(found) >= 16 and set(found) == set(cases("out")), "every examples/ script needs a case here"
    for script in found:
        path = EXAMPLES / script
        text = path.read_text()
        assert os.access(path, os.X_OK), f"{script} is not executable"
        assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text, script
        assert '"$@"' in text, f"{script} does not pass extra Hydra overrides through"
        if script.startswith(("edge_grpo/", "gepo/")):  # a paper row reads as the command it runs
            assert "vx_launch --config-name " in text and "algorithm.adv_estimator=" in text, script
    # every required variable of any script is exercised by the missing-variable test below
    declared = {m for p in EXAMPLES.rglob("*.sh") for m in re.findall(r"\$\{(\w+):\?", p.read_text())}
    tested = {v for case in cases("out").values() for v in case.required}
    assert declared == tested, (declared, tested)


def _get(doc: dict, dotted: str):
    node = doc
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, f"{dotted} missing (at {part})"
        node = node[part]
    return node


def _dry_run_in_process(argv: list[str]) -> tuple[int, str, str]:
    from verl_ext import dry_run

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = dry_run.main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("script", scripts())
def test_dry_run_prints_the_checked_config(recorded, script):
    proc, calls, case, tmp = recorded[script]
    assert proc.returncode == 0, f"{script} DRY_RUN=1 failed:\n{proc.stderr[-3000:]}"
    assert len(calls) == len(case.expect), f"{script}: {len(calls)} runs, expected {len(case.expect)}"
    for argv, expect in zip(calls, case.expect):
        assert argv[:2] == ["-m", "verl_ext.dry_run"], argv  # DRY_RUN=1 never starts verl_ext.main
        if case.args:
            assert argv[-len(case.args):] == list(case.args)  # the user's overrides go last
        rc, out, err = _dry_run_in_process(argv[2:])
        assert rc == 0, f"{script}: {err[-3000:]}"
        assert "passed verl_ext's and verl's start-up checks" in err
        (doc,) = yaml.safe_load_all(out)
        for key, value in expect.items():
            got = _get(doc, key)
            assert got == pytest.approx(value) if isinstance(value, float) else got == value, (script, key, got)
    # nothing trained, nothing written: no checkpoints, no logs, no Hydra output folder
    assert not (tmp / "out").exists() and not any((tmp / "cwd").iterdir())


def test_scripts_run_the_real_dry_run_module(tmp_path):
    """The whole chain with the real interpreter (three scripts in parallel: each process imports verl): the toy run's
    and a GPU row's dry runs print their checked config as YAML on stdout and write nothing; an invalid override
    (a group estimator with rollout.n=1) fails the script's dry run through verl_ext's start-up checks."""
    (tmp_path / "cwd").mkdir()
    jobs = {("toy/train.sh", ()): ("toy_edge_grpo_seed7", "edge_grpo"),
            ("edge_grpo/qwen2.5-math-7b/force_r.sh", ()): ("force_r_Qwen2.5-Math-7B_throughput_seed7", "grpo"),
            ("edge_grpo/qwen2.5-math-1.5b/edge_grpo.sh", ("actor_rollout_ref.rollout.n=1",)): None}
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        procs = dict(zip(jobs, pool.map(lambda job: run_script(job[0], script_env(tmp_path, {}), job[1],
                                                               tmp_path / "cwd"), jobs)))
    for (script, args), expected in jobs.items():
        proc = procs[(script, args)]
        if expected is None:
            assert proc.returncode == 1 and proc.stdout == "", proc.stderr[-3000:]
            assert "dry run: refused: ConfigError: actor_rollout_ref.rollout.n=1 is invalid" in proc.stderr
            continue
        assert proc.returncode == 0, f"{script}: {proc.stderr[-3000:]}"
        (doc,) = yaml.safe_load_all(proc.stdout)
        assert (doc["trainer"]["experiment_name"], doc["algorithm"]["adv_estimator"]) == expected
        assert "would run: " in proc.stderr and "-m verl_ext.main --config-name" in proc.stderr
    assert not (tmp_path / "out").exists() and not any((tmp_path / "cwd").iterdir())


@pytest.mark.parametrize("script", [s for s, c in cases("out").items() if c.required])
def test_missing_required_variable_is_a_one_line_error(tmp_path, script):
    case = cases(str(tmp_path))[script]
    for name in case.required:
        env = script_env(tmp_path, {k: v for k, v in case.env.items() if k != name})
        proc = run_script(script, env, cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and proc.stdout == "", (script, name, proc.stdout[-500:])
        assert len(lines) == 1 and f"{name}: set {name} " in lines[0], (script, name, proc.stderr)


def test_bad_variables_are_refused(tmp_path):
    for variable, value, message in (("METHOD", "ppo", "unknown method 'ppo'"),
                                     ("DRY_RUN", "yes", "DRY_RUN must be 0 or 1")):
        bad = run_script("toy/train.sh", script_env(tmp_path, {variable: value}), cwd=tmp_path)
        assert bad.returncode == 2 and message in bad.stderr and bad.stdout == ""
    bad = run_script("edge_grpo/qwen2.5-math-7b/force_r.sh", script_env(tmp_path, {"BATCH": "big"}), cwd=tmp_path)
    assert bad.returncode == 2 and "force_r.sh: BATCH must be throughput or paper" in bad.stderr and bad.stdout == ""
    # a real run (DRY_RUN=0) stops before starting anything when a local input is missing
    missing = run_script("edge_grpo/qwen2.5-math-1.5b/grpo.sh", script_env(tmp_path, {"DRY_RUN": "0"}, "false"),
                         cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.strip() == (
        "grpo.sh: TRAIN_FILE (python -m verl_ext.data.deepscaler writes it): data/train/train.parquet does not exist")
    assert not (tmp_path / "out").exists()

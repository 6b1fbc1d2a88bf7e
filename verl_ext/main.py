"""``python -m verl_ext.main [hydra overrides]``: verl's PPO entry point with EDGE-GRPO / GEPO wired in.

Same override grammar as ``python -m verl.trainer.main_ppo``; the config is verl's ``ppo_trainer`` plus the
``algorithm.edge_grpo`` / ``algorithm.gepo`` / ``algorithm.gec`` nodes (``hydra_configs/base.yaml``).
Without ``--config-name`` it runs the embedded CPU demo, ``hydra_configs/toy_cpu.yaml``; on GPUs the paper presets
``--config-name edge_grpo_paper`` / ``gepo_paper`` or the generic base ``--config-name verl_ext``.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

import verl_ext.plugin  # noqa: F401  (verl swallows plugin import errors; importing here surfaces them)
from verl_ext.config import config_value, register_structured_configs
from verl_ext.cpu import CPU_PLATFORM_ENV, enable_cpu_mode, is_cpu_support_active
from verl_ext.names import GREEDY_SUFFIX
from verl_ext.run_checks import validate_run_config

register_structured_configs()

RAY_LOG_GRACE_S = 2.0


@functools.lru_cache(maxsize=4)
def _toy_assets(task: str | None = None, train_sources: tuple[str, ...] | None = None):
    from verl_ext.toy import build_toy_assets
    from verl_ext.toy.build import DEFAULT_TASK

    return build_toy_assets(task=task or DEFAULT_TASK, train_sources=train_sources)


def _toy_value(key: str, task: str | None = None, *, _root_) -> str | float:
    if key == TOY_RL_LR:  # a number of the toy's specs, not a file: nothing is built for it
        return toy_rl_lr(task)
    sources = OmegaConf.select(_root_, TOY_TRAIN_SOURCES, default=None)
    if OmegaConf.is_config(sources):
        sources = OmegaConf.to_container(sources)
    return getattr(_toy_assets(task, tuple(sources) if isinstance(sources, list) else sources), key)


def toy_rl_lr(task: str | None = None) -> float:
    """The toy task's RL learning rate (``verl_ext.toy.designs.TASK_LR``; default: the default toy's)."""
    from verl_ext.toy.build import DEFAULT_TASK
    from verl_ext.toy.designs import TASK_LR

    task = task or DEFAULT_TASK
    if task not in TASK_LR:
        raise ValueError(f"${{verl_ext_toy:{TOY_RL_LR},{task}}}: toy task {task!r} must be one of {list(TASK_LR)}")
    return TASK_LR[task]


# ${verl_ext_toy:model_path} etc.: the embedded task's files, built on first use and cached (hydra_configs/toy_cpu.yaml);
# ${verl_ext_toy:model_path,add}: those of the first toy task (hydra_configs/toy/add.yaml, `+toy=add`);
# ${verl_ext_toy:rl_lr}: the task's RL learning rate (verl_ext.toy.designs.TASK_LR; nothing is built for it);
# ${verl_ext_toy:train_parquet} holds only the data sources of `+toy.train_sources=[...]` when that is set
OmegaConf.register_new_resolver("verl_ext_toy", _toy_value, replace=True)
TOY_TRAIN_SOURCES = "toy.train_sources"
TOY_RL_LR = "rl_lr"
TOY_OPTIONS = ("train_sources",)  # the keys of the `toy` node (none of them in the config unless set with `+toy.`)
_TOY_TRAIN_FILES = re.compile(r"^\$\{verl_ext_toy:\s*train_parquet\s*(?:,\s*(\w+)\s*)?\}$")


def check_toy_options(config: DictConfig) -> None:
    """The ``toy`` node's options (``+toy.train_sources=[...]``), refused with a ``ConfigError`` before anything is
    built or started: an unknown key, a bad list (``verl_ext.toy.build.check_train_sources``), or the option on a
    config whose ``data.train_files`` is not the toy's own (``${verl_ext_toy:train_parquet}``), where it would do
    nothing. Call it before the config is resolved."""
    from verl_ext.config import ConfigError
    from verl_ext.toy.build import DEFAULT_TASK, check_train_sources

    toy = config.get("toy", None)
    if toy is None:
        return
    if not OmegaConf.is_dict(toy):
        raise ConfigError(f"toy={toy!r} is invalid: the toy's options go under toy. ({list(TOY_OPTIONS)}); the "
                          "first toy task is the config group +toy=add")
    unknown = [k for k in toy if k not in TOY_OPTIONS]
    if unknown:
        raise ConfigError(f"toy.{unknown[0]} is not a toy option: the toy's options are {list(TOY_OPTIONS)}")
    sources = OmegaConf.select(config, TOY_TRAIN_SOURCES, default=None)
    if sources is None:
        return
    node = config.data._get_node("train_files") if "train_files" in config.get("data", {}) else None
    raw = node._value() if node is not None else None
    match = _TOY_TRAIN_FILES.match(raw) if isinstance(raw, str) else None
    if match is None:
        raise ConfigError(f"{TOY_TRAIN_SOURCES} selects the data sources of the embedded toy's training file "
                          f"(data.train_files=${{verl_ext_toy:train_parquet}}); here data.train_files={raw!r}")
    check_train_sources(OmegaConf.to_container(sources) if OmegaConf.is_config(sources) else sources,
                        match.group(1) or DEFAULT_TASK)


def run_dir() -> str:
    """The run's folder: Hydra's output dir inside ``python -m verl_ext.main`` (a single run or a multirun job);
    the current directory where the config was composed without a Hydra app (compose API in tests and tools)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return os.getcwd()


# ${verl_ext_run_dir:}: where metrics.jsonl and the toy's checkpoints go (hydra_configs/base.yaml, toy_cpu.yaml)
OmegaConf.register_new_resolver("verl_ext_run_dir", run_dir, replace=True)


TQ_THREADS_ENV = "TQ_NUM_THREADS"  # read by transfer_queue's client and storage at import


def transfer_queue_threads() -> int:
    """TransferQueue's torch threads in CPU mode: its default (8), at most the machine's physical cores."""
    import psutil

    return max(1, min(8, psutil.cpu_count(logical=False) or 1))


def select_platform(config: DictConfig) -> None:
    """CPU mode is explicit (``verl_ext.cpu``): ``trainer.device=cpu`` turns it on here, before verl resolves its
    platform (importing ``verl.trainer.main_ppo`` does) and before Ray starts.

    ``VERL_PLATFORM=cpu`` then reaches every Ray worker by two routes: the driver's environment, which a local
    cluster started by ``ray.init`` inherits, and the job's ``ray_kwargs.ray_init.runtime_env.env_vars``, which Ray
    applies to every actor of the job (merged into actors' own ``env_vars``), also on an existing cluster.
    """
    from verl_ext.config import ConfigError

    if str(config.trainer.get("device", "")) == "cpu":
        try:
            enable_cpu_mode()
        except ValueError as e:
            raise ConfigError(f"trainer.device=cpu: {e}") from None
    if not is_cpu_support_active():
        return
    with open_dict(config):
        ray_init = config.ray_kwargs.ray_init
        if ray_init.get("runtime_env") is None:
            ray_init.runtime_env = {}
        if ray_init.runtime_env.get("env_vars") is None:
            ray_init.runtime_env.env_vars = {}
        ray_init.runtime_env.env_vars[CPU_PLATFORM_ENV] = "cpu"
        # TransferQueue (verl's v1 trainer) sets torch to TQ_NUM_THREADS threads (default 8) around every put and
        # get, and warns each time that is more than the physical cores: on a 2-core machine hundreds of warnings a
        # second, which Ray forwards to the driver. Its own cap, set up front (unless the user set it)
        if TQ_THREADS_ENV not in ray_init.runtime_env.env_vars and TQ_THREADS_ENV not in os.environ:
            ray_init.runtime_env.env_vars[TQ_THREADS_ENV] = str(transfer_queue_threads())


# ray.init options that only size a cluster Ray starts: Ray refuses them when it joins a running one (ray 2.60
# ``ray.init``: "When connecting to an existing cluster, num_cpus and num_gpus must not be provided", and the same for
# each of these)
LOCAL_CLUSTER_ONLY = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config",
                      "_node_name", "_enable_object_reconstruction")


def joins_ray_cluster(address: str | None, temp_dir: str | None = None) -> bool:
    """Whether ``ray.init(address=address, _temp_dir=temp_dir)`` joins a running cluster rather than starting one, by
    Ray's own rule (``ray.init``'s docstring): an address other than ``local``, else ``RAY_ADDRESS``, else (unset or
    ``auto``) the cluster the last ``ray start`` recorded in Ray's temp folder (``temp_dir``, i.e.
    ``ray_kwargs.ray_init._temp_dir``; unset: ``RAY_TMPDIR``'s or ``/tmp/ray``); ``auto`` also takes a Ray running on
    this machine. A lookup that fails (``auto`` with no cluster to find, an unreadable record) is a ``ConfigError``
    naming the cause. A process that already runs Ray never calls ``ray.init`` here."""
    from verl_ext.config import ConfigError

    if address == "local":
        return False
    if address not in (None, "auto") or os.environ.get("RAY_ADDRESS"):
        return True
    try:  # None / "auto": Ray's resolution (RAY_ADDRESS, then ray_current_cluster), as ray.init calls it
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # another Ray: only the explicit signals above
        return address == "auto"
    try:
        return canonicalize_bootstrap_address(address, temp_dir) is not None
    except Exception as e:  # e.g. "auto" with no cluster to find: ray.init would raise the same
        where = f" in the temp folder ray_kwargs.ray_init._temp_dir={temp_dir}" if temp_dir else ""
        raise ConfigError(
            f"ray_kwargs.ray_init.address={address}: Ray found no cluster to join{where} ({type(e).__name__}: {e}); "
            "start one (ray start --head) or give its address (ray_kwargs.ray_init.address=<host:port> or "
            "RAY_ADDRESS), or leave the address unset (or set it to local) to start a cluster here") from None


def ray_temp_dir(config: DictConfig) -> str | None:
    """``ray_kwargs.ray_init._temp_dir`` (where Ray keeps its sessions and the last ``ray start``'s record)."""
    return OmegaConf.select(config, "ray_kwargs.ray_init._temp_dir", default=None)


def fit_ray_init_to_cluster(config: DictConfig, command_line_keys: list[str]) -> bool:
    """A run that joins a running Ray cluster (:func:`joins_ray_cluster`) takes the nodes' resources as ``ray start``
    gave them: the config's options for a cluster of its own (``LOCAL_CLUSTER_ONLY``,
    e.g. the CPU default's logical ``num_cpus``/``num_gpus``) are dropped, and one typed on the command line is
    refused, as Ray would refuse it. Without an address nothing changes. Returns whether the run joins a cluster."""
    from verl_ext.config import ConfigError

    ray_init = OmegaConf.select(config, "ray_kwargs.ray_init", default=None)
    if ray_init is None:
        return False
    address = ray_init.get("address", None)
    temp_dir = ray_temp_dir(config)
    if not joins_ray_cluster(address, temp_dir):
        return False
    if address not in (None, "auto"):
        where = f"ray_kwargs.ray_init.address={address}"
    elif os.environ.get("RAY_ADDRESS"):
        where = f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}"
    else:
        where = "the cluster the last `ray start` on this machine recorded" + (
            f" in ray_kwargs.ray_init._temp_dir={temp_dir}" if temp_dir else "")
    typed = {key.lstrip("+~") for key in command_line_keys}
    dropped = {}
    for key in LOCAL_CLUSTER_ONLY:
        value = ray_init.get(key, None)
        if value is None or (key == "_system_config" and not value):
            continue
        if f"ray_kwargs.ray_init.{key}" in typed:
            raise ConfigError(f"ray_kwargs.ray_init.{key}={value} with {where}: Ray refuses {key} when it joins a "
                              f"running cluster; give each node its resources when you start it (ray start "
                              f"--num-cpus/--num-gpus/--resources), or drop the address to start a cluster here")
        dropped[key] = value
    if dropped:
        with open_dict(config):
            for key in dropped:
                ray_init[key] = None
        print(f"[verl_ext] joining the Ray cluster ({where}): the nodes' own resources are used, not the config's "
              + ", ".join(f"ray_kwargs.ray_init.{k}={v}" for k, v in dropped.items()), flush=True)
    return True


def _command_line_keys() -> list[str]:
    """The keys the user set on the command line (Hydra's task overrides); empty outside a Hydra main."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return [o.split("=", 1)[0] for o in HydraConfig.get().overrides.task]
    except Exception:  # not running under hydra.main (e.g. run() called from code)
        return []


def apply_platform_defaults(config: DictConfig, command_line_keys: list[str]) -> None:
    """On CPU, settings that cannot run there are refused (``verl_ext.cpu.config_checks``) and verl's vLLM rollout
    gets what vLLM's CPU build needs (``verl_ext.cpu.vllm_cpu``); values the user typed on the command line are kept,
    or refused if they cannot work there."""
    if is_cpu_support_active():
        from verl_ext.cpu.config_checks import check_cpu_run_config
        from verl_ext.cpu.vllm_cpu import apply_cpu_vllm_rollout_defaults

        check_cpu_run_config(config)  # before Ray starts (verl's own entry point: the TaskRunner checks it)
        changed = apply_cpu_vllm_rollout_defaults(config, command_line_keys)
        if changed:
            print("[verl_ext] vLLM rollout on CPU: " + ", ".join(f"{k}={v}" for k, v in changed.items()))


def prepare(config: DictConfig, command_line_keys: list[str] | None = None) -> bool:
    """Everything before training, in place: platform, resolution, verl_ext's and verl's start-up checks. Returns
    whether the run joins a running Ray cluster (:func:`fit_ray_init_to_cluster`).

    ``run`` trains on the result; ``python -m verl_ext.dry_run`` prints it (so a dry run refuses what a run would).
    ``command_line_keys``: the keys the user typed (default: Hydra's task overrides of this run).
    """
    if command_line_keys is None:
        command_line_keys = _command_line_keys()
    select_platform(config)  # first: the imports below resolve verl's platform

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    check_toy_options(config)  # before resolving builds the toy's files
    OmegaConf.resolve(config)  # here, where the verl_ext_toy resolver exists (verl's TaskRunner resolves again)
    apply_platform_defaults(config, command_line_keys)  # before the checks, so they see what will run
    joins = fit_ray_init_to_cluster(config, command_line_keys)
    validate_run_config(config)  # verl_ext's start-up checks (verl_ext/run_checks.py), before verl's own
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return joins


def check_joined_cluster(config: DictConfig) -> None:
    """On a running cluster this run joins: its nodes can hold the resource pools verl will ask for
    (``verl_ext.resource_pools``), checked before verl starts its TaskRunner."""
    from verl_ext.resource_pools import check_pools_fit, joined_cluster_nodes

    address = OmegaConf.select(config, "ray_kwargs.ray_init.address", default=None)
    where = f"ray_kwargs.ray_init.address={address}" if address not in (None, "auto") else (
        f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}" if os.environ.get("RAY_ADDRESS") else "the recorded cluster")
    check_pools_fit(config, joined_cluster_nodes(address, ray_temp_dir(config)), where)


def trainer_line(config: DictConfig) -> str:
    """The line a run prints to say which of verl's trainers it runs."""
    if config_value(config, "trainer.use_v1", True):
        mode = config_value(config, "trainer.v1.trainer_mode", "sync")
        return f"[verl_ext] trainer: verl's v1 trainer, {mode} mode (trainer.use_v1=true)"
    return ("[verl_ext] trainer: verl's legacy RayPPOTrainer (trainer.use_v1=false; deprecated in verl, which will "
            "remove it: trainer.use_v1=true runs the v1 trainer)")


def run(config: DictConfig) -> None:
    joins = prepare(config)

    import ray

    if joins and not ray.is_initialized():
        check_joined_cluster(config)
    from verl.trainer.main_ppo import run_ppo

    from verl_ext.verl_compat import check_trainers

    check_trainers(bool(config.trainer.use_v1))  # here, before Ray starts: a clear error on an unexpected verl
    print(trainer_line(config), flush=True)
    from verl_ext.trainer.runner import ExtTaskRunnerLegacy, ExtTaskRunnerV1
    started_ray = not ray.is_initialized()  # run_ppo starts Ray if needed and never shuts it down
    metrics_path = run_metrics_file(config)  # before the run: a resumed run writes the next free metrics.N.jsonl
    try:
        run_ppo(config, task_runner_class=ExtTaskRunnerV1 if config.trainer.use_v1 else ExtTaskRunnerLegacy)
    finally:
        if started_ray:  # each job of a multirun (-m) gets a fresh Ray: no actors or resources left from the last
            # Ray's log monitor forwards the TaskRunner's stdout (the last step's console metrics) to this process
            # a moment later (every 0.1 s, more on a busy machine); shutting down at once would drop those lines
            time.sleep(RAY_LOG_GRACE_S)
            ray.shutdown()
    print_run_summary(metrics_path)


# ---- what the run did, printed at its end -------------------------------------------------------------------------
_VAL_KEY = re.compile(r"^val-core/(?P<source>.+)/(?P<metric>acc|reward)/(?P<stat>mean@\d+)$")


def run_metrics_file(config: DictConfig) -> str | None:
    """The metrics file this run's ``file`` logger will write (``trainer.file_logger_path``, or the next free
    ``metrics.N.jsonl`` beside it, as ``verl_ext.trainer.runner`` picks; null: verl's own default), or None when
    ``trainer.logger`` has no ``file``. Call it before the run."""
    from verl_ext.trainer.runner import file_logger_path

    trainer = config.trainer
    loggers = trainer.get("logger", None) or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    if "file" not in loggers:
        return None
    requested = trainer.get("file_logger_path", None)
    if requested:
        return file_logger_path(os.path.abspath(requested))
    root = os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", "."))
    return os.path.abspath(os.path.join(root, str(trainer.project_name), f"{trainer.experiment_name}.jsonl"))


def start_end_table(steps: dict[int, dict[str, float]]) -> str | None:
    """Held-out accuracy per data source at the run's first and last validation, as a markdown table; None when no
    validation was logged.

    ``steps`` is ``verl_ext.metrics_file.read_steps``'s ``{step: {metric: value}}``. A data source's figure is
    ``val-core/<source>/acc/mean@N`` (``reward/mean@N`` where its reward logs no ``acc``); the toy's greedy copy
    ``<source>@greedy`` goes in the same cell, after the sampled figure (``sampled / greedy``).
    """
    found: dict[str, str] = {}  # data source -> its metric key
    for _, values in sorted(steps.items()):
        for key in values:
            m = _VAL_KEY.match(key)
            if m and (m["source"] not in found or m["metric"] == "acc" and "/acc/" not in found[m["source"]]):
                found[m["source"]] = key
    val_steps = sorted(s for s, values in steps.items() if any(k in values for k in found.values()))
    if not val_steps:
        return None
    shown = sorted({val_steps[0], val_steps[-1]})
    greedy = {s for s in found if s.endswith(GREEDY_SUFFIX) and s[: -len(GREEDY_SUFFIX)] in found}
    sources = [s for s in found if s not in greedy]  # in the order the run logged them (verl: its data's order)

    def cell(source: str, step: int) -> str:
        value = steps[step].get(found[source], math.nan)
        return "—" if math.isnan(value) else f"{value:.3f}"

    head = ["held-out"] + [f"`{s}`" + (" sampled / greedy" if s + GREEDY_SUFFIX in greedy else "") for s in sources]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for step in shown:
        cells = [f"step {step}"]
        for s in sources:
            cells.append(cell(s, step) + (f" / {cell(s + GREEDY_SUFFIX, step)}" if s + GREEDY_SUFFIX in greedy else ""))
        rows.append("| " + " | ".join(cells) + " |")
    metrics = sorted({_VAL_KEY.match(k)["metric"] + "/" + _VAL_KEY.match(k)["stat"] for k in found.values()})
    return "\n".join(rows) + f"\n(val-core/<data source>/{', '.join(metrics)})"


def run_summary(steps: dict[int, dict[str, float]] | None, metrics_path: str) -> str:
    """What the run prints at its end: the start → end table (when validation was logged) and the report
    command for the run's folder (``<run folder>/metrics*.jsonl``; another file, such as verl's default
    ``<project>/<experiment>.jsonl``: that file), relative to the current directory when inside it."""
    path = os.path.abspath(metrics_path)
    target = os.path.dirname(path) if re.match(r"^metrics(\.\d+)?\.jsonl$", os.path.basename(path)) else path
    rel = os.path.relpath(target)
    shown = target if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel
    lines = []
    table = start_end_table(steps or {})
    if table:
        lines += ["[verl_ext] held-out accuracy, start → end:", table]
    lines.append(f"[verl_ext] the run's report: python -m verl_ext.report {shown}")
    return "\n".join(lines)


def print_run_summary(metrics_path: str | None) -> None:
    """After the run, in the driver: :func:`run_summary` of its metrics file; nothing when there is no such file
    here (no ``file`` logger, or a TaskRunner on another node)."""
    if not metrics_path or not os.path.isfile(metrics_path):
        return
    from verl_ext.metrics_file import read_steps

    try:
        steps, _ = read_steps(metrics_path)
    except (OSError, UnicodeDecodeError):
        return
    print(run_summary(steps, metrics_path), flush=True)


def config_dir() -> str:
    """The Hydra configs: packaged as ``verl_ext/hydra_configs`` by an install (wheel, ``pip install .``), or the
    repository's top-level ``hydra_configs/`` beside the package (editable install, PYTHONPATH checkout)."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = (os.path.join(here, "hydra_configs"), os.path.join(os.path.dirname(here), "hydra_configs"))
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, "base.yaml")):
            return candidate
    raise FileNotFoundError(f"verl_ext's Hydra configs are not installed: none of {list(candidates)} has base.yaml")


# No arguments: the embedded CPU demo (toy_cpu). Real runs: `--config-name edge_grpo_paper|gepo_paper|verl_ext`
# plus model/data overrides.
@hydra.main(config_path=config_dir(), config_name="toy_cpu", version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    main()

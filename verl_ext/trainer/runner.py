"""verl's TaskRunners (the Ray actor that hosts the trainer, i.e. the driver), pointed at verl_ext's trainers.

Both of verl's runners pick their trainer class by a lookup at call time (v1: the trainer registry; legacy: the
global ``RayPPOTrainer``, named in ``main_ppo_v0.TaskRunner.run``), so each runner here redirects that lookup inside its
own process and then runs verl's ``run`` unchanged.  Each first checks that what it relies on in verl is there
(``verl_ext.verl_compat``, docs/verl-integration.md).  Both also point verl's ``file`` logger (created in this
process) at ``trainer.file_logger_path``.
"""

from __future__ import annotations

import os

import ray
from verl.trainer import main_ppo
from verl.trainer.main_ppo_v0 import TaskRunner


def file_logger_path(requested: str) -> str:
    """``requested``, or ``stem.N.suffix`` (first free N) if a file is there: verl's FileLogger truncates its file,
    so a run resumed into the same folder must not write over the metrics of the run it continues."""
    stem, suffix = os.path.splitext(requested)
    path, n = requested, 0
    while os.path.exists(path) and os.path.getsize(path) > 0:
        n += 1
        path = f"{stem}.{n}{suffix}"
    return path


def point_file_logger(config) -> None:
    """In this process (where verl's Tracking builds its FileLogger), set verl's VERL_FILE_LOGGER_PATH from
    ``trainer.file_logger_path`` (null: verl's own default, ``./<project>/<experiment>.jsonl``)."""
    requested = config.trainer.get("file_logger_path", None)
    if requested:
        os.makedirs(os.path.dirname(os.path.abspath(requested)), exist_ok=True)
        os.environ["VERL_FILE_LOGGER_PATH"] = file_logger_path(os.path.abspath(requested))


def check_platform_settings(config) -> None:
    """In CPU mode, refuse the settings verl accepts that cannot give a correct run there (``verl_ext.cpu``)."""
    from verl_ext.cpu import is_cpu_support_active

    if is_cpu_support_active():
        from verl_ext.cpu.config_checks import check_cpu_run_config

        check_cpu_run_config(config)


if hasattr(main_ppo, "TaskRunnerV1"):

    @ray.remote
    class ExtTaskRunnerV1(main_ppo.TaskRunnerV1.__ray_actor_class__):
        def run(self, config):
            from verl_ext.trainer.v1 import install_extension_trainers
            from verl_ext.verl_compat import check_trainers

            check_trainers(use_v1=True)
            check_platform_settings(config)
            point_file_logger(config)
            install_extension_trainers()
            return super().run(config)

else:  # a verl without the v1 trainer (verl's `neo` branch): verl_compat.check_v1_trainer refuses use_v1=true
    ExtTaskRunnerV1 = None


@ray.remote
class ExtTaskRunnerLegacy(TaskRunner.__ray_actor_class__):
    def run(self, config):
        from verl_ext.trainer.legacy import ExtRayPPOTrainer
        from verl_ext.verl_compat import check_trainers

        check_trainers(use_v1=False)  # among others: run() below reads the global RayPPOTrainer
        check_platform_settings(config)
        point_file_logger(config)
        verl_run = super().run
        # Ray ships this actor class by value (verl's module attribute is the ActorClass, not the class), so the
        # name must be rebound in the globals verl's run() actually reads, in this actor's process only.
        verl_run.__func__.__globals__["RayPPOTrainer"] = ExtRayPPOTrainer
        return verl_run(config)

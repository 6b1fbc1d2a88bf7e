"""verl's TaskRunners (the Ray actor that hosts the trainer, i.e. the driver), pointed at verl_ext's trainers.

Both of verl's runners pick their trainer class by a lookup at call time (v1: the trainer registry; legacy: the
global ``RayPPOTrainer``, named in ``main_ppo_v0.TaskRunner.run``), so each runner here redirects that lookup
inside its own process and then runs verl's ``run`` unchanged.
"""

from __future__ import annotations

import ray
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.main_ppo_v0 import TaskRunner


@ray.remote
class ExtTaskRunnerV1(TaskRunnerV1.__ray_actor_class__):
    def run(self, config):
        from verl_ext.trainer.v1 import install_extension_trainers

        install_extension_trainers()
        return super().run(config)


@ray.remote
class ExtTaskRunnerLegacy(TaskRunner.__ray_actor_class__):
    def run(self, config):
        from verl_ext.trainer.legacy import ExtRayPPOTrainer

        verl_run = super().run
        # Ray ships this actor class by value (verl's module attribute is the ActorClass, not the class), so the
        # name must be rebound in the globals verl's run() actually reads, in this actor's process only.
        verl_run.__func__.__globals__["RayPPOTrainer"] = ExtRayPPOTrainer
        return verl_run(config)

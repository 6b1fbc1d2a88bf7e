"""What verl's ``verl.plugins`` entry point runs in every process that imports verl.

verl loads this module from ``verl/__init__.py`` in the driver, the TaskRunner, every worker and every
agent-loop worker, so registrations done here are visible everywhere without the user importing anything.
verl swallows plugin import errors (logged at DEBUG only); ``verl_ext.main`` therefore imports this module
itself so a broken install fails loudly there.
"""

from verl_ext.cpu import activate_cpu_support_if_needed

activate_cpu_support_if_needed()  # first, and only with VERL_PLATFORM=cpu: before verl resolves a device

import verl_ext.algos.registry  # noqa: E402, F401  (registers edge_grpo and gepo with register_adv_est)
import verl_ext.rollout.gec_agent_loop  # noqa: E402, F401  (registers the gec_agent agent loop)

from verl_ext.lr_schedule import install as _install_linear_lr  # noqa: E402

_install_linear_lr()  # lr_scheduler_type=linear for verl's FSDP engine (EDGE-GRPO's schedule)

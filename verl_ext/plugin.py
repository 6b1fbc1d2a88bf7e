"""What verl's ``verl.plugins`` entry point runs in every process that imports verl.

verl loads this module from ``verl/__init__.py`` in the driver, the TaskRunner, every worker and every
agent-loop worker, so registrations done here are visible everywhere without the user importing anything.
verl swallows plugin import errors (logged at DEBUG only); ``verl_ext.main`` therefore imports this module
itself so a broken install fails loudly there.
"""

from verl_ext.cpu import activate_cpu_support_if_needed
from verl_ext.algos import registry  # noqa: F401  (registers edge_grpo and gepo with register_adv_est)

activate_cpu_support_if_needed()

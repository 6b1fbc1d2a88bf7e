import os

import pytest

# keep test processes quiet and CPU-only whatever the machine
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# CPU mode is explicit (verl_ext.cpu): unit tests that build verl's engine in this process need it. Tests of the
# switch itself and the e2e runs start subprocesses with VERL_PLATFORM set or removed as their claim requires.
os.environ.setdefault("VERL_PLATFORM", "cpu")

# The README's test command runs the suite on three pytest-xdist workers (``-n 3``; pytest.ini: ``--dist loadgroup
# --no-loadscope-reorder``): an e2e run is a chain of fresh Python processes started one after the other (driver, Ray,
# TaskRunner, workers, rollout server, agent-loop worker: each importing torch, verl and transformers), ~70 s of
# which ~1 core is busy on 2 idle cores; three at a time finish a run every ~44 s, two every ~58 s, four every ~52 s
# (docs/cpu.md "The test suite's time"). Work units are handed out in the order below, longest first, so that the lanes
# end together: each e2e test on its own (or its module, or its xdist_group mark, where tests share a run), then the
# unit tests a module at a time (their module fixtures build toy models, verl engines and Ray clusters once per
# module, not once per lane). A module not listed keeps its place after the listed ones of its kind.
E2E_LONGEST_FIRST = ["test_pipeline", "test_two_nodes", "test_compare", "test_vllm_rollout", "test_gpu_settings",
                     "test_examples_run", "test_combinations", "test_multirun", "test_hints", "test_cpu_pipeline",
                     "test_evaluate",
                     "test_toy_build"]
UNIT_LONGEST_FIRST = ["test_plugin", "test_actor_losses_cluster", "test_cpu_mode", "test_import_first", "test_examples",
                      "test_toy", "test_batch_split_grid", "test_sweeps", "test_packaging", "test_config",
                      "test_hf_rollout", "test_gec", "test_actor_losses"]
# e2e modules whose tests share a module fixture (one from-scratch toy build; one two-node Ray cluster): one work unit,
# else each worker that gets one of its tests builds the fixture again (two two-node clusters at once, beside a third
# lane's run, took Ray past its 30 s raylet start-up wait in other runs: 2026-12-08)
E2E_ONE_UNIT = {"test_toy_build", "test_two_nodes"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the xdist_group marks into work units
def pytest_collection_modifyitems(config, items):
    def rank(item: pytest.Item) -> tuple:
        module = item.path.stem
        e2e = item.path.parent.name == "e2e"
        order = E2E_LONGEST_FIRST if e2e else UNIT_LONGEST_FIRST
        return (not e2e, order.index(module) if module in order else len(order))

    for item in items:
        module = item.path.stem
        if item.path.parent.name != "e2e" or module in E2E_ONE_UNIT:
            item.add_marker(pytest.mark.xdist_group(f"{item.path.parent.name}/{module}"))
    items.sort(key=rank)  # stable: the collection order within a rank


@pytest.hookimpl(trylast=True)  # after xdist's own hook has given each grouped item its "@group" suffix
def pytest_collection_finish(session) -> None:
    _check_groups_took(session.config, session.items)


def _check_groups_took(config, items) -> None:
    """On a pytest-xdist worker with ``--dist loadgroup``: every item with an ``xdist_group`` mark carries its group in
    its nodeid, which is what xdist's scheduler groups by; else a group's tests would be spread over the workers and
    each worker would build the group's module fixtures (Ray clusters, toy builds, end-to-end runs) again."""
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist --dist loadgroup: {len(lost)} grouped tests carry no group in their nodeid (e.g. {lost[0]}),"
            " so their groups would be split over the workers: this pytest/pytest-xdist pair does not group (pytest "
            "9.2 with xdist 3.8 does not); install the test extra's pins (pip install -e '.[test]')")

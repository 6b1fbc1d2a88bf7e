"""What installing verl_ext costs a verl process: ``import verl`` with and without verl_ext's plugin, one run.

    python benchmarks/bench_plugin_import.py [--repeats 7] [--python PATH] [--check]

verl loads every ``verl.plugins`` entry point from ``verl/__init__.py`` unless ``VERL_USE_EXTERNAL_PLUGINS=none``
(verl 0.9.1). Each case is a fresh ``python -c`` process, with the plugin (the variable unset: verl's ``auto``) and
without it (``none``), in alternating order round by round (ABBA) after one warm-up each. Reported: the median wall
time of the whole process, its CPU time and the median peak RSS (``os.wait4``'s rusage of that one child), and the
ratios; the wall ratio also as the median of per-round ratios (the two runs of a round see about the same load on a
shared machine). Load-independent views of the plugin's own cost: one run with ``-X importtime`` (the verl_ext
modules each case loads, their own code), and ``import verl_ext.plugin`` timed inside a process that imported verl.

Cases:
  * ``import verl``: a process that imports verl but neither the advantage module nor the agent loop (a verl tool,
    a data script); goal <= 1.05x wall and <= 10 MiB extra peak RSS.
  * ``+ core_algos + agent_loop + optimizer config``: a process that does import them (the driver, the TaskRunner,
    workers); what it pays for the registrations.

``VERL_PLATFORM`` is removed from the children's environment (the GPU default; CPU mode is not measured here).
``--python`` times another interpreter (e.g. another checkout's venv). ``--check`` exits 1 when the first case is
outside the goal. Each child asserts that the plugin loaded (or not) and, in the second case, that the
registrations are there, so a case cannot silently measure the wrong thing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROBE = r"""
import json, sys
{imports}
ok = True
if {check_registered}:
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    ok = ("edge_grpo" in ADV_ESTIMATOR_REGISTRY) == ("gec_agent" in _agent_loop_registry) == {plugin}
print("PROBE " + json.dumps({{"plugin": "verl_ext.plugin" in sys.modules, "ok": ok}}))
"""

HOOKED = ("verl.trainer.ppo.core_algos", "verl.experimental.agent_loop", "verl.workers.config.optimizer")
CASES = {
    "import verl": ("import verl", False),
    "+ core_algos + agent_loop + optimizer config": ("import verl\n" + "\n".join(f"import {m}" for m in HOOKED), True),
}
GOAL_WALL_RATIO = 1.05
GOAL_EXTRA_MIB = 10.0


def measure(python: str, code: str, plugin: bool, flags: tuple[str, ...] = ()) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MiB, output) of one child process; raises if it failed or measured the wrong thing."""
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_PLUGINS")}
    if not plugin:
        env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.posix_spawn(python, [python, *flags, "-c", code], env, file_actions=[
        (os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2), (os.POSIX_SPAWN_CLOSE, r)])
    os.close(w)
    with os.fdopen(r) as pipe:
        out = pipe.read()
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"child failed ({status}): {out[-2000:]}")
    probe = json.loads(next(line for line in out.splitlines() if line.startswith("PROBE "))[6:])
    if probe["plugin"] != plugin or not probe["ok"]:
        raise RuntimeError(f"child measured the wrong thing (plugin expected {plugin}): {probe}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, out  # ru_maxrss: KiB on Linux


PLUGIN_TIMER = r"""
import time
from importlib.metadata import entry_points
import verl  # with VERL_USE_EXTERNAL_PLUGINS=none: verl without the plugin
t0 = time.perf_counter()
entry_points(group="verl.plugins")  # verl's discovery (any plugin, or none, installed)
t1 = time.perf_counter()
import verl_ext.plugin  # what verl's entry point then runs
print("PLUGIN_MS", (time.perf_counter() - t1) * 1000.0, (t1 - t0) * 1000.0)
"""


def plugin_import_ms(python: str) -> tuple[float, float]:
    """(ms of ``import verl_ext.plugin``, ms of verl's entry-point discovery) in a process that imported verl."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    out = subprocess.run([python, "-c", PLUGIN_TIMER], env=env, capture_output=True, text=True, timeout=600,
                         check=True).stdout
    fields = next(line for line in out.splitlines() if line.startswith("PLUGIN_MS ")).split()
    return float(fields[1]), float(fields[2])


def ext_code_ms(python: str, code: str) -> float:
    """``python -X importtime``, one run: milliseconds of the verl_ext modules' own code that ``import`` statements
    load (the hooks' imports; not the plugin module itself, which verl loads through ``importlib``)."""
    out = measure(python, code, True, ("-X", "importtime"))[3]
    own = 0.0
    for line in out.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        self_us, _, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if self_us.isdigit() and name.startswith("verl_ext"):
            own += int(self_us) / 1000.0
    return own


def bench_case(python: str, imports: str, check_registered: bool, repeats: int) -> dict:
    codes = {p: PROBE.format(imports=imports, check_registered=check_registered, plugin=p) for p in (True, False)}
    for plugin in (True, False):  # warm-up: file cache, .pyc files
        measure(python, codes[plugin], plugin)
    runs: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    for i in range(repeats):
        order = (True, False) if i % 2 == 0 else (False, True)  # ABBA: neither variant always runs first
        for plugin in order:
            runs[plugin].append(measure(python, codes[plugin], plugin)[:3])

    def med(plugin: bool, k: int) -> float:
        return statistics.median(r[k] for r in runs[plugin])

    paired = statistics.median(w[0] / wo[0] for w, wo in zip(runs[True], runs[False]))  # same round: same load
    own_ms = ext_code_ms(python, codes[True])
    return {
        "wall_with": med(True, 0), "wall_without": med(False, 0), "wall_ratio": med(True, 0) / med(False, 0),
        "wall_ratio_paired": paired, "cpu_with": med(True, 1), "cpu_without": med(False, 1),
        "cpu_ratio": med(True, 1) / med(False, 1), "rss_with": med(True, 2), "rss_without": med(False, 2),
        "rss_extra": med(True, 2) - med(False, 2), "ext_code_ms": own_ms,
        "wall_min_ratio": min(r[0] for r in runs[True]) / min(r[0] for r in runs[False]),
        "runs": runs,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--python", default=sys.executable, help="the interpreter to time (its venv's verl and verl_ext)")
    p.add_argument("--check", action="store_true", help="exit 1 if `import verl` is outside the goal")
    args = p.parse_args()

    print(f"python {args.python}, {args.repeats} runs per variant, load average {os.getloadavg()}")
    results = {}
    for name, (imports, check_registered) in CASES.items():
        r = results[name] = bench_case(args.python, imports, check_registered, args.repeats)
        print(f"{name}:\n  wall  with {r['wall_with']:.2f} s, without {r['wall_without']:.2f} s, "
              f"ratio {r['wall_ratio']:.3f}x (median of per-round ratios {r['wall_ratio_paired']:.3f}x, "
              f"fastest runs {r['wall_min_ratio']:.3f}x)\n"
              f"  rounds (with / without, s): "
              f"{', '.join(f'{w[0]:.1f}/{wo[0]:.1f}' for w, wo in zip(r['runs'][True], r['runs'][False]))}\n"
              f"  CPU   with {r['cpu_with']:.2f} s, without {r['cpu_without']:.2f} s, ratio {r['cpu_ratio']:.3f}x\n"
              f"  peak RSS  with {r['rss_with']:.1f} MiB, without {r['rss_without']:.1f} MiB, "
              f"extra {r['rss_extra']:+.1f} MiB\n"
              f"  verl_ext modules imported by statements, their own code (-X importtime, one run): "
              f"{r['ext_code_ms']:.1f} ms")
    timed = [plugin_import_ms(args.python) for _ in range(3)]
    print(f"timed inside a process that imported verl (median of 3): `import verl_ext.plugin` "
          f"{statistics.median(t[0] for t in timed):.1f} ms; verl's own entry-point discovery, which "
          f"VERL_USE_EXTERNAL_PLUGINS=none skips, {statistics.median(t[1] for t in timed):.1f} ms")
    first = results["import verl"]
    within = first["wall_ratio"] <= GOAL_WALL_RATIO and first["rss_extra"] <= GOAL_EXTRA_MIB
    print(f"goal for `import verl` (<= {GOAL_WALL_RATIO}x wall, <= {GOAL_EXTRA_MIB:.0f} MiB extra): "
          f"{'met' if within else 'NOT met'}; load average after {os.getloadavg()}")
    return 0 if within or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())

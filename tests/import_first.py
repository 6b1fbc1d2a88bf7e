"""Import each module first in a fresh process; print one JSON line of the failures.

    python tests/import_first.py [--jobs N] [--cpu-mode both|on|off] [MODULE ...]

Without module names: every module of verl_ext (found on disk, nothing imported to find them) and every verl module
verl_ext imports or names (``from verl.x import y``, ``"verl.x.y"``), i.e. the modules its hooks watch or touch.
Each import runs in a fork of this process, which has loaded only third-party packages (torch, transformers, ray,
...), never a verl or verl_ext module, so a child starts as a fresh process would, minus the third-party import
time. A child fails when the import raises, when a verl_ext registration failed in it
(``verl_ext.import_hooks.hook_failures``), or when verl was imported but verl's plugin entry point
(``verl_ext.plugin``) did not load. A module that fails is imported once more with ``VERL_USE_EXTERNAL_PLUGINS=none``
(verl without verl_ext): if it fails there too, the failure is verl's or the environment's own (e.g. a verl module
for a backend that is not installed), reported under ``"without_verl_ext_too"`` and not counted. With
``--cpu-mode both`` each module is imported twice: without and with ``VERL_PLATFORM=cpu`` (CPU mode adds
registrations to ``import verl``).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

# third-party packages verl imports, loaded once before forking: never a verl or verl_ext module
PRELOAD = ("numpy", "pandas", "pyarrow", "torch", "tensordict", "transformers", "transformers.models",
           "transformers.modeling_utils", "transformers.processing_utils", "transformers.models.auto.modeling_auto",
           "transformers.models.mistral.modeling_mistral", "ray", "omegaconf", "hydra", "accelerate", "transfer_queue",
           "requests", "jsonschema", "zmq", "psutil", "codetiming", "msgspec", "torch._inductor.lowering",
           "torch._inductor.kernel", "torch._inductor.codegen.common", "torch._export.serde.serialize", "peft",
           "fastapi", "datasets", "aiohttp", "networkx", "pydantic", "ray.dag")
_VERL_NAME = re.compile(r"^verl(\.[A-Za-z_]\w*)+$")


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # a top-level name: finds, imports nothing
    return Path(next(iter(spec.submodule_search_locations)))


def _module_name(root: Path, package: str, path: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ext_modules() -> list[str]:
    """Every module of verl_ext on disk (``__main__`` files are scripts, not modules)."""
    root = _package_dir("verl_ext")
    return sorted(_module_name(root, "verl_ext", p) for p in root.rglob("*.py") if p.name != "__main__.py")


def _exists(verl_root: Path, name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (verl_root / rel).with_suffix(".py").is_file() or (verl_root / rel / "__init__.py").is_file()


def touched_verl_modules() -> list[str]:
    """The verl modules verl_ext's code imports or names (those that exist in the installed verl)."""
    ext_root, verl_root = _package_dir("verl_ext"), _package_dir("verl")
    names: set[str] = set()
    for path in ext_root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("verl."):
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)  # kept if it is a module
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names if a.name.startswith("verl."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _VERL_NAME.match(node.value):
                names.add(node.value)
    return sorted(n for n in names if _exists(verl_root, n))


def _child(name: str, cpu_mode: bool, plugins: bool) -> int:
    """In the forked child: import ``name`` first; 0 when it and verl_ext's registrations went through."""
    if not plugins:
        os.environ["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    if cpu_mode:
        os.environ["VERL_PLATFORM"] = "cpu"
    else:
        os.environ.pop("VERL_PLATFORM", None)
    try:
        importlib.import_module(name)
    except BaseException:
        traceback.print_exc()
        return 1
    if plugins and "verl" in sys.modules and "verl_ext.plugin" not in sys.modules:
        print("verl was imported but its verl_ext plugin did not load (see the log above)", file=sys.stderr)
        return 1
    hooks = sys.modules.get("verl_ext.import_hooks")
    failures = hooks.hook_failures() if hooks is not None else []
    for message in failures:
        print(message, file=sys.stderr)
    return 1 if failures else 0


def _start(name: str, cpu_mode: bool, plugins: bool) -> tuple[int, str]:
    fd, log = tempfile.mkstemp(suffix=".log")
    pid = os.fork()
    if pid == 0:  # the child: its output to the log, then exit without running the parent's atexit handlers
        code = 1
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = _child(name, cpu_mode, plugins)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(fd)
    return pid, log


SECONDS: dict[tuple[str, bool], float] = {}  # wall time of each child


def _run(pending: list[tuple[str, bool]], jobs: int, plugins: bool) -> dict[tuple[str, bool], str]:
    """Import every (name, cpu mode) first, ``jobs`` children at a time; {(name, mode): log tail} of the failures."""
    pending = list(pending)
    running: dict[int, tuple[str, bool, str, float]] = {}
    failures: dict[tuple[str, bool], str] = {}
    while pending or running:
        while pending and len(running) < jobs:
            name, mode = pending.pop(0)
            pid, log = _start(name, mode, plugins)
            running[pid] = (name, mode, log, time.monotonic())
        pid, status = os.wait()
        name, mode, log, started = running.pop(pid)
        SECONDS[(name, mode)] = time.monotonic() - started
        text = Path(log).read_text()
        os.unlink(log)
        if os.waitstatus_to_exitcode(status) != 0:
            failures[(name, mode)] = text[-3000:]
    return failures


def run_all(names: list[str], modes: list[bool], jobs: int) -> dict:
    """The failures that verl_ext causes, and those that verl without verl_ext has too ({"name [mode]": log})."""
    failed = _run([(n, m) for m in modes for n in names], jobs, plugins=True)
    stock = _run(list(failed), jobs, plugins=False)

    def label(key):
        return f"{key[0]} [{'cpu' if key[1] else 'default'}]"

    return {"failures": {label(k): v for k, v in failed.items() if k not in stock},
            "without_verl_ext_too": {label(k): v[-300:] for k, v in failed.items() if k in stock}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cpu-mode", choices=("both", "on", "off"), default="both")
    args = parser.parse_args()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    early = sorted(m for m in sys.modules if m.split(".")[0] in ("verl", "verl_ext"))
    if early:
        raise SystemExit(f"a preloaded package imported verl or verl_ext: {early[:5]}")
    names = args.modules or ext_modules() + touched_verl_modules()
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.cpu_mode]
    result = run_all(names, modes, args.jobs)
    slowest = sorted(SECONDS.items(), key=lambda kv: -kv[1])[:10]
    result["slowest_s"] = {f"{n} [{'cpu' if m else 'default'}]": round(t, 2) for (n, m), t in slowest}
    print(json.dumps({"imported": len(names) * len(modes), **result}))


if __name__ == "__main__":
    main()

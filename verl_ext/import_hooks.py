"""Post-import hooks: run a function right after a named module has been executed in this process.

``verl_ext.plugin`` registers verl_ext with verl lazily through these: an estimator registration runs when verl's
``core_algos`` is imported, the ``gec_agent`` loop when verl's agent-loop package is, and so on, so a process that
imports verl but never those modules pays for none of it.

:func:`when_imported` puts one finder at the front of ``sys.meta_path``. For a watched module name it asks the other
finders for the spec, as the import system would, and wraps the spec's loader so that ``exec_module`` runs the
module and then its hooks; the module itself gets the original loader back (``__loader__``, ``__spec__.loader``),
so it looks exactly as it would without the hook. Every other import passes through untouched. A module that is
already imported has its hooks run at once. An ``around`` hook runs in place of the module's execution and executes
it itself (``verl_ext.cpu.vllm_cpu`` changes a function only while a module body runs).

A hook that raises never breaks the import that fired it (installing verl_ext must not break verl's own imports):
the failure is logged at ERROR, naming what was being registered, the verl module and the cause, and kept
(:func:`hook_failures`); the registration is then missing in that process, and verl_ext's entry points and trainers
raise it as :class:`PluginHookError` at start-up (:func:`raise_hook_failures`). An ``around`` hook is the exception:
it runs the module's code itself, so its failure is re-raised out of the import as a broken import would be.

A registration whose verl_ext module imports the watched verl module at its top finds that module half-executed
when the import started there (:func:`module_initializing`); such a registration is left to the module's own body
(a decorator), so every module imports first in a fresh process.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger(__name__)

Hook = Callable[[ModuleType], None]
AroundHook = Callable[[Callable[[ModuleType], None], ModuleType], None]

# module name -> [(what the hook does, hook, runs around the module's execution)], in registration order
_HOOKS: dict[str, list[tuple[str, Callable, bool]]] = {}
_FAILURES: list[str] = []  # messages of the hooks that failed in this process, in order


class PluginHookError(RuntimeError):
    """A verl_ext registration that runs when a verl module is imported failed (the message names the cause)."""


def when_imported(module_name: str, what: str, hook: Hook | AroundHook, *, around: bool = False) -> None:
    """Run ``hook(module)`` right after ``module_name`` is executed in this process, or now if it already is.

    Args:
        module_name: the full dotted name of the module to watch.
        what: what the hook does, for the error message ("register the gec_agent agent loop").
        hook: called with the executed module; must be idempotent (a reload runs it again). Registering the same
            hook again for the same module does nothing.
        around: ``hook(exec_module, module)`` runs in place of the module's execution and calls
            ``exec_module(module)`` itself (to change something only while the module body runs); for a module
            already imported it gets an ``exec_module`` that does nothing.
    """
    hooks = _HOOKS.setdefault(module_name, [])
    entry = (what, hook, around)
    if entry in hooks:
        return
    hooks.append(entry)
    _install_finder()
    module = sys.modules.get(module_name)
    if module is not None:
        _run_hook(module_name, what, hook, around, module, lambda m: None)


def module_initializing(name: str) -> bool:
    """True while module ``name`` is being executed by an import in progress (in ``sys.modules``, half-run)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and bool(getattr(spec, "_initializing", False))


def hook_failures() -> list[str]:
    """The messages of the registrations that failed in this process (each logged at ERROR where it fired)."""
    return list(_FAILURES)


def raise_hook_failures() -> None:
    """Raise :class:`PluginHookError` with every registration that failed in this process, if any."""
    if _FAILURES:
        raise PluginHookError("; ".join(_FAILURES))


def watched() -> dict[str, list[str]]:
    """What is hooked: module name -> what its hooks do."""
    return {name: [what for what, _, _ in hooks] for name, hooks in _HOOKS.items()}


def _run_hook(module_name: str, what: str, hook: Callable, around: bool, module: ModuleType,
              exec_module: Callable[[ModuleType], None]) -> None:
    module_errors: list[BaseException] = []

    def run_module(m: ModuleType) -> None:  # the module's own failure is not the hook's
        try:
            exec_module(m)
        except BaseException as e:
            module_errors.append(e)
            raise

    try:
        if around:
            hook(run_module, module)
        else:
            hook(module)
    except Exception as e:  # any failure of a registration: reported with its cause, re-raised
        if e in module_errors:
            raise
        message = (f"verl_ext could not {what} when {module_name} was imported: {type(e).__name__}: {e} "
                   "(a verl_ext plugin hook, verl_ext/plugin.py; VERL_USE_EXTERNAL_PLUGINS=none runs verl "
                   "without verl_ext)")
        logger.error(message)
        if around:  # the module's code may not have run: the import fails, as a broken import would
            raise PluginHookError(message) from e
        if message not in _FAILURES:
            _FAILURES.append(message)


def _execute(module: ModuleType, exec_module: Callable[[ModuleType], None]) -> None:
    """The module's code (inside its ``around`` hooks, the first registered outermost), then its other hooks."""
    hooks = list(_HOOKS.get(module.__name__, ()))
    run = exec_module
    for what, hook, around in reversed(hooks):
        if around:
            run = _around(module.__name__, what, hook, run)
    run(module)
    for what, hook, around in hooks:
        if not around:
            _run_hook(module.__name__, what, hook, False, module, lambda m: None)


def _around(module_name: str, what: str, hook: AroundHook, inner: Callable[[ModuleType], None]):
    def run(module: ModuleType) -> None:
        _run_hook(module_name, what, hook, True, module, inner)

    return run


class _HookedLoader(importlib.abc.Loader):
    """The module's own loader, then its hooks."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # give the module its own loader back before its code runs: it looks exactly as it would without the hook
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _execute(module, self._loader.exec_module)

    def __getattr__(self, name):  # get_source, is_package, get_resource_reader, ...: the original's
        if name == "_loader":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name, wraps the loader of the spec the other finders return."""

    def __init__(self):
        self._local = threading.local()  # per thread: the names this thread is looking up

    def _searching(self) -> set[str]:
        names = getattr(self._local, "names", None)
        if names is None:
            names = self._local.names = set()
        return names

    def find_spec(self, fullname, path=None, target=None):
        searching = self._searching()
        if fullname not in _HOOKS or fullname in searching:
            return None
        searching.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            searching.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        if not hasattr(spec.loader, "exec_module"):  # a legacy loader: nothing to wrap
            logger.error("verl_ext cannot hook %s (its loader %r has no exec_module): %s will not happen",
                         fullname, spec.loader, "; ".join(what for what, _, _ in _HOOKS[fullname]))
            return spec
        if not isinstance(spec.loader, _HookedLoader):
            spec.loader = _HookedLoader(spec.loader)
        return spec


def _install_finder() -> None:
    if not any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


__all__ = ["PluginHookError", "hook_failures", "module_initializing", "raise_hook_failures", "watched",
           "when_imported"]

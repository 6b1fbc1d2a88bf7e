"""Post-import hooks: run a function right after a named module has been executed in this process.

``verl_ext.plugin`` registers verl_ext with verl lazily through these: an estimator registration runs when verl's
``core_algos`` is imported, the ``gec_agent`` loop when verl's agent-loop package is, and so on, so a process that
imports verl but never those modules pays for none of it.

:func:`when_imported` puts one finder at the front of ``sys.meta_path``. For a watched module name it asks the other
finders for the spec, as the import system would, and wraps the spec's loader so that ``exec_module`` runs the
module and then its hooks; the module itself gets the original loader back (``__loader__``, ``__spec__.loader``),
so it looks exactly as it would without the hook. Every other import passes through untouched. A module that is
already imported has its hooks run at once.

A hook that raises is loud where it fires: it is logged at ERROR and re-raised as :class:`PluginHookError` naming
what was being registered, the verl module, and the cause, out of the import statement that triggered it (which
then fails, as a broken import would). It is not an ``ImportError``, so ``try: import ... except ImportError``
around an optional import does not swallow it.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger(__name__)

Hook = Callable[[ModuleType], None]

# module name -> [(what the hook does, hook)], in registration order
_HOOKS: dict[str, list[tuple[str, Hook]]] = {}


class PluginHookError(RuntimeError):
    """A verl_ext registration that runs when a verl module is imported failed (the message names the cause)."""


def when_imported(module_name: str, what: str, hook: Hook) -> None:
    """Run ``hook(module)`` right after ``module_name`` is executed in this process, or now if it already is.

    Args:
        module_name: the full dotted name of the module to watch.
        what: what the hook does, for the error message ("register the gec_agent agent loop").
        hook: called with the executed module; must be idempotent (a reload runs it again).
    """
    _HOOKS.setdefault(module_name, []).append((what, hook))
    _install_finder()
    module = sys.modules.get(module_name)
    if module is not None:
        _run_hook(module_name, module, what, hook)


def watched() -> dict[str, list[str]]:
    """What is hooked: module name -> what its hooks do."""
    return {name: [what for what, _ in hooks] for name, hooks in _HOOKS.items()}


def _run_hook(module_name: str, module: ModuleType, what: str, hook: Hook) -> None:
    try:
        hook(module)
    except Exception as e:  # any failure of a registration: reported with its cause, re-raised
        message = (f"verl_ext could not {what} after {module_name} was imported: {type(e).__name__}: {e} "
                   "(a verl_ext plugin hook, verl_ext/plugin.py; VERL_USE_EXTERNAL_PLUGINS=none runs verl "
                   "without verl_ext)")
        logger.error(message)  # also where a caller swallows the exception
        raise PluginHookError(message) from e


def _run_hooks(module: ModuleType) -> None:
    for what, hook in list(_HOOKS.get(module.__name__, ())):
        _run_hook(module.__name__, module, what, hook)


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
        self._loader.exec_module(module)
        _run_hooks(module)

    def __getattr__(self, name):  # get_source, is_package, get_resource_reader, ...: the original's
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name, wraps the loader of the spec the other finders return."""

    def __init__(self):
        self._searching: set[str] = set()  # names being looked up (the import lock serialises each name)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _HOOKS or fullname in self._searching:
            return None
        self._searching.add(fullname)
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
            self._searching.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        if not hasattr(spec.loader, "exec_module"):  # a legacy loader: nothing to wrap
            logger.error("verl_ext cannot hook %s (its loader %r has no exec_module): %s will not happen",
                         fullname, spec.loader, "; ".join(what for what, _ in _HOOKS[fullname]))
            return spec
        if not isinstance(spec.loader, _HookedLoader):
            spec.loader = _HookedLoader(spec.loader)
        return spec


def _install_finder() -> None:
    if not any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


__all__ = ["PluginHookError", "watched", "when_imported"]

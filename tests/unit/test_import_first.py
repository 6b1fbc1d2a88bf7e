"""Installing verl_ext breaks no import: every module of verl_ext, and every verl module it imports or names (the
ones its hooks watch or touch), imports first in a fresh process, with and without CPU mode, and no verl_ext
registration fails there (``tests/import_first.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "import_first.py"


def test_every_module_imports_first_in_a_fresh_process():
    env = {k: v for k, v in os.environ.items()
           if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_PLUGINS", "VERL_USE_EXTERNAL_MODULES", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "2"], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["imported"] >= 2 * 80, out["imported"]  # both modes, verl_ext's ~60 modules and verl's ~35
    assert not out["failures"], "\n\n".join(f"== {name}\n{log}" for name, log in out["failures"].items())
    # what fails without verl_ext as well is verl's own (e.g. its vLLM package without a vLLM it recognises)
    assert all(not name.startswith("verl_ext") for name in out["without_verl_ext_too"]), out["without_verl_ext_too"]

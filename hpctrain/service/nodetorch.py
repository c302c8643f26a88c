"""`submit`'s check of the torch the nodes will run (hpctrain/kernel/support.py TORCH).

Refused only on certain knowledge: when the nodes run a Python this host can run as it is (the
profile's launch.python, the PYTHON override, or this interpreter) with no modules, setup lines,
activation or container that could change what it imports there, and that Python's torch is
outside the range. Otherwise the preflight gate checks it on every node. torch is never imported
here: its version is read from torch/version.py (a few milliseconds, not a second).
"""

from __future__ import annotations

import os
import re
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.kernel.errors import UserError
from hpctrain.kernel.support import torch_problem

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

# stdlib only, run by the node's Python: its torch version, or nothing when it has none
_PROBE = (
    "import importlib.util as u, re, pathlib as p\n"
    "s = u.find_spec('torch')\n"
    "f = p.Path(list(s.submodule_search_locations)[0]) / 'version.py' if s else None\n"
    'm = re.search(r"__version__\\s*=\\s*[\'\\"]([^\'\\"]+)", f.read_text()) if f and f.exists() '
    "else None\n"
    "print(m.group(1) if m else '')\n"
)


def local_torch_version() -> str | None:
    """This interpreter's torch release, without importing torch (None: not installed)."""
    try:
        spec = find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        return None
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    return m.group(1) if m else None


def node_torch_version(python: str) -> str | None:
    """The torch release of `python` (None: not known here, or not installed)."""
    if python == sys.executable:
        return local_torch_version()
    if not (os.path.isabs(python) and os.access(python, os.X_OK)):
        return None  # `python` resolved on the node (an activated env, a container)
    import subprocess  # lazy: CLI start-up: only to ask another interpreter (dry runs ask none)

    try:
        res = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (res.stdout.strip() or None) if res.returncode == 0 else None


def check(profile: ResolvedProfile, python: str) -> None:
    """Refuse (exit 2, one line) a node Python whose torch is outside the supported range."""
    env = profile.environment
    if env.modules or env.setup or env.activate or env.container:
        return  # what the node imports depends on those: the preflight gate checks it there
    version = node_torch_version(python)
    if version is None:
        return
    problem = torch_problem(version, where=f"the nodes' Python {python}")
    if problem:
        raise UserError(problem)

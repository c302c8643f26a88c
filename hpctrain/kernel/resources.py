"""Where the bundled templates and site profiles are: inside the wheel, or beside the package
in a source checkout (editable install)."""

from __future__ import annotations

from pathlib import Path

_PKG = (
    Path(__file__).resolve().parent.parent
)  # hpctrain/ (this file is hpctrain/kernel/resources.py)


def bundled(name: str) -> Path:
    """`bundled("templates")` or `bundled("site_configs")`."""
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"hpctrain is installed without its {name}/ folder (looked in {_PKG})")

"""Helpers shared by tests/test_profiles.py and tests/test_profile_layers.py."""

from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner

from hpctrain.cli import main

REPO = Path(__file__).resolve().parent.parent

SHIPPED = sorted(p.stem for p in (REPO / "site_configs").glob("*.yaml"))


def write(path: Path, text: str | bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)  # whatever the umask: a group-writable dir is refused
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    os.chmod(path, mode)
    return path


def cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output
    return result


def invalid(path: Path) -> str:
    """Run `profiles validate`; it must fail with exit 2 and no traceback. Returns the output."""
    result = cli("profiles", "validate", str(path))
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    return result.output

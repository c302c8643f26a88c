"""The profiles' safe YAML reader: hpctrain.kernel.yamlsafe with the profiles' parse cache."""

from __future__ import annotations

from pathlib import Path

from hpctrain.kernel.errors import Problem
from hpctrain.kernel.yamlsafe import (  # noqa: F401  (the names profiles import from here)
    MAX_BYTES,
    MAX_DEPTH,
    MAX_INT,
    Doc,
    Path_,
    _bad_text,
    dotted,
    yaml_scalar,
)
from hpctrain.kernel.yamlsafe import read_yaml as _read_yaml
from hpctrain.profiles import cache


def read_yaml(path: Path, problems: list[Problem]) -> Doc | None:
    """Load one profile file safely (every problem appended); a text read before comes from the
    parse cache."""
    return _read_yaml(path, problems, cache=cache)

"""The releases hpctrain supports: torch, DeepSpeed and Python (the one source of these ranges).

A range is `>=LOW,<HIGH`, written as pyproject.toml writes it (tests/test_support.py checks that
pyproject's dependencies say the same). Both ends are tested: the main venv (`make venv`) has the
newest torch and DeepSpeed, the compatibility lane (`make test-compat`, part of `make test`) the
oldest, LANE below. `submit` and the preflight gate refuse a node whose torch is outside TORCH with
one line (`torch_problem`). Sites ship torch 2.7.1 (EESSI 2025.06) and 2.8.0 (site modules, NGC
25.06 containers), so 2.7 is the floor; 2.14.1 is the newest release the registry served when the
range was last tested.

Torch-free and stdlib only: the CLI reads it before deciding whether it needs anything heavy, and
the gate's node process reads it before it imports torch.
"""

from __future__ import annotations

import re

TORCH = ">=2.7,<2.15"
DEEPSPEED = ">=0.17,<0.20"
PYTHON = ">=3.11,<3.14"
# What `make venv` installs and what the compatibility lane installs (`make test-compat`): between
# them, the oldest torch and DeepSpeed (the lane) and both ends of Python. The Makefile reads these.
MAIN = {"torch": "2.13.0", "deepspeed": "0.19.8", "python": "3.11"}
LANE = {"torch": "2.7.1", "deepspeed": "0.17.6", "python": "3.13"}

RANGES = {"torch": TORCH, "deepspeed": DEEPSPEED, "python": PYTHON}


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '2.8.0+cu128' and '2.8.0a0+5228986.nv25.06'
    (a container's build of 2.8) are both (2, 8, 0)."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(x) for x in m.group(1).split("."))


def bounds(spec: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(low, high) of a `>=LOW,<HIGH` range."""
    found: dict[str, str] = {}
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(>=|<)\s*(\S+)\s*", part)
        if not m:
            raise ValueError(f"not a >=LOW,<HIGH range: {spec!r}")
        found[m.group(1)] = m.group(2)
    return release(found[">="]), release(found["<"])


def within(version: str, spec: str) -> bool:
    low, high = bounds(spec)
    have = release(version)
    pad = max(len(low), len(high), len(have))

    def norm(v: tuple[int, ...]) -> tuple[int, ...]:  # 2.7 == 2.7.0
        return v + (0,) * (pad - len(v))

    return norm(low) <= norm(have) < norm(high)


def torch_problem(version: str | None, where: str = "this node") -> str | None:
    """None when `version` (torch.__version__) is supported, else the one line that says so."""
    if version is None:
        return f"torch is not installed on {where}; hpctrain needs torch {TORCH}"
    try:
        ok = within(version, TORCH)
    except ValueError:
        ok = False
    if ok:
        return None
    return (
        f"torch {version} on {where} is outside hpctrain's supported range {TORCH} "
        f"(tested {LANE['torch']} to 2.14.1); load a torch in that range "
        "(a site module or container), or pip install 'torch" + TORCH + "' into the node's Python"
    )


if __name__ == "__main__":  # `python hpctrain/kernel/support.py lane torch` (the Makefile)
    import sys

    print({"main": MAIN, "lane": LANE}[sys.argv[1]][sys.argv[2]])

"""The supported releases have one source (hpctrain/kernel/support.py) that pyproject.toml, the
compatibility lane and the gate agree with, and torch's private names are used in one module
(train_entry/compat.py), so a torch release that moves them breaks one file, tested by the lane."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpctrain.kernel import support

REPO = Path(__file__).resolve().parent.parent
COMPAT = "train_entry/compat.py"
SCANNED = ("hpctrain", "train_entry", "examples")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _requirement(reqs: list[str], name: str) -> str:
    found = [r for r in reqs if re.match(rf"{name}\s*[<>=!~]", r)]
    assert len(found) == 1, f"pyproject.toml lists {name} {len(found)} times: {found}"
    return found[0][len(name) :].replace(" ", "")


def test_pyproject_states_the_kernel_ranges() -> None:
    project = _pyproject()["project"]
    assert _requirement(project["dependencies"], "torch") == support.TORCH
    assert _requirement(project["optional-dependencies"]["deepspeed"], "deepspeed") == (
        support.DEEPSPEED
    )
    assert project["requires-python"] == support.PYTHON


def test_the_lane_and_the_main_venv_test_the_range_and_make_reads_them() -> None:
    for name, spec in support.RANGES.items():
        low, _ = support.bounds(spec)
        tested = (support.MAIN[name], support.LANE[name])
        assert all(support.within(v, spec) for v in tested), (name, tested, spec)
        assert any(support.release(v)[: len(low)] == low for v in tested), (
            f"make test must test the oldest supported {name} ({spec}), not only {tested}"
        )
    assert support.release(support.LANE["torch"])[:2] == support.bounds(support.TORCH)[0]
    # the Makefile takes every version from the kernel, never spells them itself
    makefile = (REPO / "Makefile").read_text()
    assert "SUPPORT := python3 hpctrain/kernel/support.py" in makefile
    for which, versions in (("main", support.MAIN), ("lane", support.LANE)):
        for name, want in versions.items():
            got = subprocess.run(
                [sys.executable, str(REPO / "hpctrain/kernel/support.py"), which, name],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            assert got == want
            assert f"$(SUPPORT) {which} {name}" in makefile, (which, name)
    for version in (*support.MAIN.values(), *support.LANE.values()):
        if version.count(".") == 2:
            assert version not in makefile, f"the Makefile spells {version} itself"


def test_the_readme_states_the_ranges() -> None:
    readme = (REPO / "README.md").read_text()
    for spec in support.RANGES.values():
        assert spec in readme


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("2.7.0", True),
        ("2.7.1+cu126", True),
        ("2.8.0a0+5228986c39.nv25.06", True),  # an NGC container's build
        ("2.14.1", True),
        ("2.6.0", False),
        ("2.15.0", False),
        ("nonsense", False),
    ],
)
def test_torch_problem_names_the_version_and_the_range(version: str, ok: bool) -> None:
    line = support.torch_problem(version, "n1")
    if ok:
        assert line is None
    else:
        assert line is not None and "\n" not in line
        assert version in line and support.TORCH in line and "n1" in line


def _torch_roots(tree: ast.AST) -> set[str]:
    """Local names bound to a torch module (import torch.distributed as dist, from torch import nn)."""
    roots = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    roots.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            roots.update(a.asname or a.name for a in node.names)
    return roots


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_torch_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of each private torch name: an import of `torch.x._y` (module or name), or an
    attribute `_y` of a torch module (torch._C, dist._functional ...)."""
    tree = ast.parse(source)
    roots = _torch_roots(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "torch" and any(map(_private, parts)):
                    found.append((node.lineno, a.name))
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            if parts[0] != "torch":
                continue
            for a in node.names:
                if any(map(_private, parts)) or _private(a.name):
                    found.append((node.lineno, f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            chain, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in roots:
                found.append((node.lineno, ".".join([inner.id, *reversed(chain)])))
    return found


def test_the_scan_finds_each_kind_of_private_use() -> None:
    source = (
        "import torch\nimport torch.distributed as dist\nimport torch._dynamo\n"
        "from torch.distributed._shard._utils import narrow_tensor_by_index\n"
        "from torch.distributed.checkpoint.filesystem import _StorageInfo\n"
        "x = torch._C._get_tracing_state\ny = dist._functional_collectives\n"
        "z = torch.__version__\nfrom torch.distributed.checkpoint import FileSystemWriter\n"
    )
    lines = sorted({line for line, _ in private_torch_uses(source)})
    assert lines == [3, 4, 5, 6, 7]


def test_private_torch_names_only_in_the_compat_module() -> None:
    found = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == COMPAT:
                continue
            found += [f"{rel}:{n}: {name}" for n, name in private_torch_uses(path.read_text())]
    assert not found, (
        f"private torch names outside {COMPAT} (add them there, with a version gate or a public "
        "fallback, and import them from it):\n  " + "\n  ".join(found)
    )
    assert private_torch_uses((REPO / COMPAT).read_text()), "the compat module is what it says"


# --- submit and the preflight gate refuse a torch outside the range ------------------------------


def _fake_python(tmp_path: Path, version: str) -> Path:
    """A node Python whose torch is `version` (a torch/version.py on its path, as a real one has)."""
    (tmp_path / "site" / "torch").mkdir(parents=True)
    (tmp_path / "site" / "torch" / "__init__.py").write_text("")
    (tmp_path / "site" / "torch" / "version.py").write_text(f"__version__ = {version!r}\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


@pytest.mark.parametrize(("version", "refused"), [("2.6.0+cu124", True), ("2.8.0", False)])
def test_submit_refuses_a_node_torch_outside_the_range(tmp_path, monkeypatch, version, refused):
    from click.testing import CliRunner

    from hpctrain.cli import main

    for var in ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var))
    monkeypatch.chdir(tmp_path)
    python = _fake_python(tmp_path, version)
    args = ["submit", "--profile", "local", "--name", "x", "--dry-run"]
    out = CliRunner().invoke(main, [*args, "--set", f"launch.python={python}"])
    if refused:
        assert out.exit_code == 2 and "Traceback" not in out.output, out.output
        line = out.output.strip().removeprefix("Error: ")
        assert "\n" not in line and version in line and support.TORCH in line, line
    else:
        assert out.exit_code == 0, out.output


def test_the_gate_fails_a_node_whose_torch_is_outside_the_range(tmp_path, monkeypatch) -> None:
    import torch

    from hpctrain.checks.preflight import gate, node

    monkeypatch.setattr(torch, "__version__", "2.6.0")
    rows, _ = node.check_imports("train_entry", "train_entry")
    failed = [r for r in rows if r["status"] == "fail"]
    assert [r["name"] for r in failed] == ["torch"]
    assert (
        "torch 2.6.0 on this node" in failed[0]["detail"] and support.TORCH in failed[0]["detail"]
    )
    # every node the same: the cause is the environment, said once
    bad = {"n1": failed[0]["detail"], "n2": failed[0]["detail"]}
    action, reason, _ = gate.decide(
        [], bad, min_nodes=1, on_fail="requeue", can_requeue=True, excluded=[]
    )
    assert action == "fail" and reason.count("outside hpctrain's supported range") == 1


def test_each_node_saves_verifies_and_loads_a_checkpoint_before_the_ranks_meet(tmp_path) -> None:
    from train_entry.checkpoint import roundtrip

    assert roundtrip.problem(tmp_path / "ckpt") is None
    assert not (tmp_path / "ckpt").exists()


def test_a_start_names_a_broken_checkpoint_path_before_training(tmp_path, monkeypatch) -> None:
    import torch.distributed.checkpoint.filesystem as fs

    from train_entry.config import TrainConfig
    from train_entry.trainer import RunFailed, Trainer

    monkeypatch.delattr(fs, "_StorageInfo")  # what a torch that moved the name does
    with pytest.raises(RunFailed) as e:
        Trainer(TrainConfig(), run_dir=tmp_path / "run", grad_accum=1)._check_checkpoint_path()
    line = str(e.value)
    # an ImportError where train_entry.checkpoint is imported after the name went, a pickling
    # error of the name where it was imported before: either way the line names it
    assert line.startswith("a test save failed: ") and "_StorageInfo" in line, line
    assert "before training" in line and "hpctrain resume run" in line, line
    assert not any((tmp_path / "run" / "preflight").iterdir())  # the round trip's folder is gone

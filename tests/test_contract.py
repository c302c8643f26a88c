"""The kernel's contracts hold tree-wide: one definition of every job-environment name, no click or
torch on the training side's import path, a torch-free kernel, and generated docs that match."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from hpctrain.kernel import checkpoint as ckptformat
from hpctrain.kernel import docs, jobenv, layout, strategies

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("hpctrain", "train_entry", "benchmarks", "tests", "examples")
DEFINITION = REPO / "hpctrain" / "kernel" / "jobenv.py"


def python_files() -> list[Path]:
    return sorted(
        p
        for d in SCANNED
        if (REPO / d).is_dir()
        for p in (REPO / d).rglob("*.py")
        # not .venv, nor benchmarks/.work (scratch a benchmark test writes and removes meanwhile)
        if not any(part.startswith(".") for part in p.relative_to(REPO).parts)
    )


def test_job_environment_names_are_spelled_in_one_python_file() -> None:
    """The rule: the prefix appears only in hpctrain/kernel/jobenv.py (the table, the constants and
    the one reader, `jobenv.get`). Everyone else writes `jobenv.RUN_DIR`; prose writes the key
    (`RUN_DIR`) or `{var.RUN_DIR}` through `jobenv.fill`."""
    offenders = []
    # click's own _HPCTRAIN_COMPLETE (shell completion) is not a job variable
    own = re.compile(rf"(?<!\w){jobenv.PREFIX}")
    for path in python_files():
        if path == DEFINITION:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if own.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, (
        "job environment names spelled outside hpctrain/kernel/jobenv.py; add the "
        "variable to jobenv.VARS and use its constant:\n" + "\n".join(offenders)
    )


def test_the_template_gets_the_names_from_its_context() -> None:
    for tpl in sorted((REPO / "templates").rglob("*.j2")):
        text = tpl.read_text(encoding="utf-8")
        assert jobenv.PREFIX not in text, (
            f"{tpl}: use {{{{ var.KEY }}}} (hpctrain/kernel/jobenv.py)"
        )
        used = {m.split()[0] for m in text.split("var.")[1:]}
        keys = {u.rstrip("}").split("}")[0] for u in used}
        assert keys <= set(jobenv.BY_KEY), (
            f"{tpl}: unknown job environment keys {keys - set(jobenv.BY_KEY)}"
        )


def test_the_table_is_consistent() -> None:
    names = [v.name for v in jobenv.VARS]
    assert len(names) == len(set(names))
    constants = {
        k: v
        for k, v in vars(jobenv).items()
        if k.isupper() and isinstance(v, str) and v.startswith(jobenv.PREFIX) and k != "PREFIX"
    }
    assert sorted(constants.values()) == sorted(names), "one constant per row of jobenv.VARS"
    assert all(jobenv.PREFIX + k == v for k, v in constants.items())
    assert jobenv.get(jobenv.RUN_DIR, environ={jobenv.RUN_DIR: "/r"}) == "/r"
    try:
        jobenv.get(jobenv.PREFIX + "NO_SUCH", environ={})
    except KeyError as e:
        assert "not in the job environment contract" in str(e)
    else:
        raise AssertionError("an unknown name must be refused")


def test_training_side_never_imports_click_and_the_kernel_nothing_heavy() -> None:
    code = (
        "import sys, train_entry.trainer, train_entry.cli, train_entry.checkpoint; "
        "assert 'click' not in sys.modules, 'train_entry imported click'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    modules = ", ".join(
        f"hpctrain.kernel.{p.stem}" for p in (REPO / "hpctrain" / "kernel").glob("*.py")
    )
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in '{modules}'.split(', ')]; "
        "heavy = ('click', 'torch', 'pydantic', 'jinja2', 'rich', 'submitit', 'numpy'); "
        "heavy = [m for m in heavy if m in sys.modules]; assert not heavy, heavy"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_the_kernel_imports_only_itself_and_the_standard_library() -> None:
    # xxhash: one C extension without dependencies, the checkpoint weights' digest (checkpoint.py
    # imports it only to verify an entry that names xxh3_128)
    allowed = set(sys.stdlib_module_names) | {"hpctrain", "yaml", "xxhash"}
    for path in (REPO / "hpctrain" / "kernel").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top in allowed, f"{path.name} imports {name}: the kernel stays light"
                if top == "hpctrain":
                    assert name.startswith("hpctrain.kernel"), f"{path.name} imports {name}"


def test_design_doc_tables_are_generated_from_the_kernel() -> None:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    # profile-keys: generated from the schema by hpctrain/profiles/docs.py (test_profile_layers)
    assert docs.sections_in(text) == set(docs.SECTIONS) | {"profile-keys"}
    assert text == docs.fill(text), (
        "docs/design.md's contract tables are out of date; refresh them "
        "with: .venv/bin/python -m hpctrain.kernel.docs docs/design.md"
    )


def test_run_folder_names_are_all_in_the_table() -> None:
    paths = {e.path for e in layout.ENTRIES}
    for key, value in vars(layout).items():
        if key.isupper() and isinstance(value, str):
            assert value in paths or any(p.startswith(value + "/") for p in paths), (
                f"layout.{key} = {value!r} is not in ENTRIES"
            )


def test_checkpoint_names() -> None:
    assert ckptformat.step_name(42) == "step-00000042"
    assert ckptformat.step_of("step-00000042") == 42
    assert ckptformat.step_of(ckptformat.staging_name(7)) == 7
    assert ckptformat.step_of("step-42") is None
    assert f"{layout.CHECKPOINTS}/{ckptformat.LATEST}" in {e.path for e in layout.ENTRIES}


def test_strategy_names_have_one_list() -> None:
    assert strategies.NAMES == ("ddp", "fsdp", "deepspeed")
    assert strategies.CHOICES == (*strategies.NAMES, strategies.AUTO)
    for name in strategies.NAMES:
        assert (REPO / "train_entry" / "strategies" / f"{name}.py").is_file(), (
            f"no module for {name}"
        )

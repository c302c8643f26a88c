"""What code a remote --module run sends (hpctrain/remote/code.py), without a site: the committed
tree of the repository the module is imported from here, and the import root inside it."""

from __future__ import annotations

import subprocess

import pytest

from hpctrain.kernel.errors import UserError
from hpctrain.remote.code import pack, pythonpath


def repo_with(tmp_path, files: dict[str, str], commit: bool = True):
    repo = tmp_path / "repo"
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    if commit:
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", "c"], check=True)
    return repo


def test_module_in_a_src_layout_sends_the_repo_and_names_the_import_root(tmp_path, monkeypatch):
    repo = repo_with(tmp_path, {"src/pkg/__init__.py": "", "src/pkg/train.py": "", "README": "x"})
    monkeypatch.setenv("PYTHONPATH", str(repo / "src"))
    code = pack(tmp_path / "out", script=None, sync=None, module="pkg.train", cwd=tmp_path)
    assert code is not None and code.root == "src" and code.script is None
    assert (tmp_path / "out" / "README").is_file() and (
        tmp_path / "out" / "src/pkg/train.py"
    ).is_file()
    assert pythonpath("/site/runs/x/code", code, {}) == "/site/runs/x/code/src:${PYTHONPATH:-}"
    assert pythonpath("/c", code, {"PYTHONPATH": "/opt/lib"}) == "/c/src:/opt/lib"

    # from the current folder, a top-level module file: the repository's top is the root
    monkeypatch.delenv("PYTHONPATH")
    (repo / "tool.py").write_text("")
    subprocess.run(["git", "-C", str(repo), "add", "tool.py"], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.org",
            "commit",
            "-qm",
            "t",
        ],
        check=True,
    )
    code = pack(tmp_path / "out2", script=None, sync=None, module="tool", cwd=repo)
    assert code is not None and code.root == ""


def test_module_refusals_say_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(UserError, match="cannot be imported from here.*--sync DIR"):
        pack(tmp_path / "o1", script=None, sync=None, module="no_such_pkg_xyz", cwd=tmp_path)
    repo = repo_with(tmp_path, {"pkg/__init__.py": "", "pkg/new.py": ""}, commit=False)
    with pytest.raises(
        UserError, match=r"--module pkg.new \(pkg/new.py\) is not in the last commit"
    ):
        pack(tmp_path / "o2", script=None, sync=None, module="pkg.new", cwd=repo)
    # --sync DIR: the folder as it is, DIR the import root when it holds the package
    code = pack(tmp_path / "o3", script=None, sync=str(repo), module="pkg.new", cwd=tmp_path)
    assert code is not None and code.root == "" and (tmp_path / "o3" / "pkg" / "new.py").is_file()
    with pytest.raises(UserError, match="is not inside --sync"):
        pack(tmp_path / "o4", script=None, sync=str(repo / "pkg"), module="pkg.new", cwd=tmp_path)

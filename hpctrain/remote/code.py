"""The user's code for a remote run: the committed tree of their git repository (`git archive HEAD`,
so what runs is exactly a commit), or an explicit folder (`--sync DIR`). It lands in the run folder
on the site as `code/`."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError


@dataclass(frozen=True)
class Code:
    source: str  # "git <repo> <commit>", "folder <dir>"
    script: str | None  # the --script path relative to code/
    warning: str | None = None


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True)


def pack(
    dest: Path, *, script: str | None, sync: str | None, cwd: Path | None = None
) -> Code | None:
    """Put the code into `dest` (an empty folder); None when the run needs none (train_entry
    without --sync)."""
    script_path = Path(script).expanduser().resolve() if script else None
    if sync:
        root = Path(sync).expanduser().resolve()
        if not root.is_dir():
            raise UserError(f"--sync {sync}: not a folder; fix: give the folder holding your code")
        rel = None
        if script_path is not None:
            if not script_path.is_relative_to(root):
                raise UserError(
                    f"--script {script} is not inside --sync {sync}; fix: give a script "
                    "inside the folder that is sent"
                )
            rel = str(script_path.relative_to(root))
        shutil.copytree(
            root,
            dest,
            symlinks=True,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(".git", "__pycache__", "runs"),
        )
        return Code(f"folder {root}", rel)
    if script_path is None:
        return None
    where = script_path.parent
    top = _git(where, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise UserError(
            f"--script {script} is not in a git repository, and only committed code is "
            "sent to a remote site; fix: commit it in a repository, or send a folder "
            "with --sync DIR"
        )
    repo = Path(top.stdout.decode().strip())
    rel = str(script_path.relative_to(repo.resolve()))
    if _git(repo, "cat-file", "-e", f"HEAD:{rel}").returncode != 0:
        raise UserError(
            f"--script {script} is not in the last commit of {repo}; fix: "
            f"`git add {rel} && git commit`, or send the folder with --sync DIR"
        )
    commit = _git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    archive = _git(repo, "archive", "--format=tar", "HEAD")
    if archive.returncode != 0:
        raise UserError(f"git archive failed in {repo}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    warning = (
        f"{repo} has uncommitted changes; they are not sent (commit {commit[:12]} is)"
        if dirty
        else None
    )
    return Code(f"git {repo} {commit[:12]}", rel, warning)


# -- on the site: the uploaded code becomes the run folder's code/ ---------------------------------
def adopt(prepared: Any, code_dir: Path) -> None:
    """Point a prepared submission's --script at RUN/code/... instead of the upload folder, and
    render again (the script was checked where it was uploaded)."""
    import dataclasses

    from hpctrain.render import render

    req = prepared.request
    if req.entry.kind == "script":
        rel = Path(req.entry.target).resolve().relative_to(code_dir.resolve())
        entry = dataclasses.replace(req.entry, target=str(prepared.run.path / "code" / rel))
        prepared.request = dataclasses.replace(req, entry=entry)
    prepared.script = render(
        prepared.profile, prepared.request, prepared.run.path, python=prepared.python
    )


def install(run_path: Path, code_dir: Path) -> None:
    """Move the uploaded code into the new run folder (before its job is submitted)."""
    shutil.move(str(code_dir), str(run_path / "code"))

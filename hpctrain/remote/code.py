"""The user's code for a remote run: the committed tree of their git repository (`git archive HEAD`,
so what runs is exactly a commit), or an explicit folder (`--sync DIR`). It lands in the run folder
on the site as `code/`.

The repository is the one holding the `--script`, or for `--module pkg.mod` the one holding the
folder it is imported from here, found the way the local run would import it: the current folder,
then PYTHONPATH, then this Python's path (an editable install points into its repository). That
folder, relative to code/, is the import root on the site: the job's PYTHONPATH starts with it."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib.machinery import PathFinder
from pathlib import Path

from hpctrain.kernel.errors import UserError


@dataclass(frozen=True)
class Code:
    source: str  # "git <repo> <commit>", "folder <dir>"
    script: str | None  # the --script path relative to code/
    warning: str | None = None
    root: str | None = None  # --module: the import root relative to code/ ("" for code/ itself)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True)


def import_root(module: str, cwd: Path | None = None) -> Path | None:
    """The folder `python -m MODULE` would import MODULE's top package from, run here: the current
    folder, PYTHONPATH, then this interpreter's path. Nothing is imported (no package code runs)."""
    here = Path(cwd or Path.cwd())
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    entries = [str(here), *(str(here / p) for p in extra), *sys.path[1:]]
    spec = PathFinder.find_spec(module.split(".")[0], entries)
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package (regular or namespace): root/pkg/
        return Path(list(spec.submodule_search_locations)[0]).resolve().parent
    return Path(spec.origin).resolve().parent if spec.origin else None


def _module_path(root: Path, module: str) -> Path | None:
    """MODULE's file or package folder under ROOT, if it is there."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_name(base.name + ".py"), base):
        if candidate.exists():
            return candidate
    return None


@dataclass(frozen=True)
class _Asked:
    """What the run names: its --script, its --module and where that imports from here."""

    script: str | None
    module: str | None
    script_path: Path | None  # the --script, resolved
    mod_root: Path | None = None  # --module: the folder it is imported from here
    mod_path: Path | None = None  # --module: its file or package folder


def pack(
    dest: Path,
    *,
    script: str | None,
    sync: str | None,
    module: str | None = None,
    cwd: Path | None = None,
) -> Code | None:
    """Put the code into `dest` (an empty folder); None when the run needs none (train_entry
    without --sync)."""
    asked = _Asked(script, module, Path(script).expanduser().resolve() if script else None)
    if module:
        mod_root = import_root(module, cwd)
        mod_path = _module_path(mod_root, module) if mod_root is not None else None
        if mod_path is None and not sync:
            raise UserError(
                f"--module {module} cannot be imported from here (the current folder, "
                "PYTHONPATH, this Python's path), so there is no code to send; fix: run from "
                "the folder that holds its package or set PYTHONPATH, or send a folder with "
                "--sync DIR"
            )
        asked = replace(asked, mod_root=mod_root, mod_path=mod_path)
    if sync:
        return _copy(dest, sync=sync, asked=asked)
    target = asked.script_path or asked.mod_path
    if target is None:
        return None
    return _archive(dest, target=target, asked=asked)


def _copy(dest: Path, *, sync: str, asked: _Asked) -> Code:
    """--sync DIR: the folder copied as it is (hpctrain's own folders and special files left out)."""
    root = Path(sync).expanduser().resolve()
    if not root.is_dir():
        raise UserError(f"--sync {sync}: not a folder; fix: give the folder holding your code")
    rel = None
    if asked.script_path is not None:
        if not asked.script_path.is_relative_to(root):
            raise UserError(
                f"--script {asked.script} is not inside --sync {sync}; fix: give a script "
                "inside the folder that is sent"
            )
        rel = str(asked.script_path.relative_to(root))
    import_rel = None
    if asked.module:
        mod_root = asked.mod_root
        if asked.mod_path is not None and mod_root is not None and mod_root.is_relative_to(root):
            import_rel = _norm(str(mod_root.relative_to(root)))
        elif _module_path(root, asked.module) is not None:
            import_rel = ""  # DIR holds the package: DIR is the import root
        else:
            raise UserError(
                f"--module {asked.module} is not inside --sync {sync}; fix: send the folder "
                "that holds its package"
            )
    special: list[str] = []
    try:
        shutil.copytree(
            root, dest, symlinks=True, dirs_exist_ok=True, ignore=_ignore(root, special)
        )
    except (OSError, shutil.Error) as e:
        raise UserError(
            f"--sync {sync}: cannot copy it ({_first(e)}); fix: make its files readable"
        ) from None
    warning = (
        f"--sync {sync}: skipped {len(special)} entries that are not files or folders "
        f"(FIFOs, sockets, devices): {', '.join(special[:3])}"
        if special
        else None
    )
    return Code(f"folder {root}", rel, warning=warning, root=import_rel)


def _archive(dest: Path, *, target: Path, asked: _Asked) -> Code:
    """The last commit of the repository holding `target` (the script, or the module's file)."""
    script_path, mod_root = asked.script_path, asked.mod_root
    what = f"--script {asked.script}" if script_path is not None else f"--module {asked.module}"
    top = _git(target.parent, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise UserError(
            f"{what} is not in a git repository"
            + ("" if script_path is not None else f" (it is imported from {target})")
            + ", and only committed code is sent to a remote site; fix: commit it in a "
            "repository, or send a folder with --sync DIR"
        )
    repo = Path(top.stdout.decode().strip()).resolve()
    rel = str(target.relative_to(repo))
    root_rel = None
    if mod_root is not None and script_path is None:
        if not mod_root.is_relative_to(repo):
            raise UserError(
                f"--module {asked.module} is imported from {mod_root}, outside its repository "
                f"{repo}; fix: send the folder that holds its package with --sync DIR"
            )
        root_rel = _norm(str(mod_root.relative_to(repo)))
    if _git(repo, "cat-file", "-e", f"HEAD:{rel}").returncode != 0:
        raise UserError(
            f"{what} ({rel}) is not in the last commit of {repo}; fix: "
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
    return Code(
        f"git {repo} {commit[:12]}", rel if script_path is not None else None, warning, root_rel
    )


def _norm(rel: str) -> str:
    return "" if rel == "." else rel


def pythonpath(site_code: str, code: Code, env: dict[str, str]) -> str:
    """The job's PYTHONPATH for a --module run: the import root in the run's code/ on the site,
    then whatever the profile's environment.env or the node's environment already has."""
    root = site_code + (f"/{code.root}" if code.root else "")
    rest = env.get("PYTHONPATH") or "${PYTHONPATH:-}"
    return f"{root}:{rest}"


def _ignore(root: Path, special: list[str]) -> Callable[[str, list[str]], set[str]]:
    """copytree's ignore: hpctrain's own folders, and anything that is not a file, folder or
    symlink (reading a FIFO would wait forever; a socket cannot be copied)."""
    skip = shutil.ignore_patterns(".git", "__pycache__", "runs")

    def ignore(folder: str, names: list[str]) -> set[str]:
        out = set(skip(folder, names))
        for n in names:
            try:
                mode = os.lstat(os.path.join(folder, n)).st_mode
            except OSError:
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                out.add(n)
                special.append(os.path.relpath(os.path.join(folder, n), root))
        return out

    return ignore


def _first(e: BaseException) -> str:
    """One line for a copy error (shutil.Error carries a list of (src, dst, why))."""
    args = e.args[0] if isinstance(e, shutil.Error) and e.args else None
    if isinstance(args, list) and args and isinstance(args[0], tuple) and len(args[0]) == 3:
        return f"{args[0][0]}: {args[0][2]}"
    return str(e)

"""On the site: the code a remote submit uploaded becomes the run folder's code/ (`submit --code
DIR`; hpctrain/remote/code.py packs that code on this machine)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

from hpctrain.kernel.errors import UserError
from hpctrain.service.prepare import Prepared

# The folder a remote submit uploads to: WORKDIR/incoming/<run name>-<8 hex>/code (remote/submit.py).
_UPLOAD = re.compile(r"^[^/]+-[0-9a-f]{8}\Z")


def check_upload(code_dir: Path, script: str | None = None) -> Path:
    """`--code DIR` is how a remote submit hands its upload to the site's `submit`, which MOVES it
    into the run folder: only such an upload folder is taken, checked before anything is written."""
    path = Path(os.path.abspath(code_dir))
    if (
        path.name != "code"
        or path.parent.parent.name != "incoming"
        or not _UPLOAD.match(path.parent.name)
        or path.is_symlink()
    ):
        raise UserError(
            f"--code {code_dir}: not the upload folder of a remote submit "
            "(WORKDIR/incoming/NAME-XXXXXXXX/code); --code moves the folder it is given into the "
            "run folder, so it takes nothing else; fix: leave --code out (from your own machine, "
            "`submit --sync DIR` sends a folder as the run's code)"
        )
    if script is not None:
        try:
            Path(script).resolve().relative_to(path.resolve())
        except ValueError:
            raise UserError(
                f"--script {script} is not inside --code {code_dir}; fix: give the script's path "
                "inside the uploaded folder"
            ) from None
    return path


def adopt(prepared: Prepared, code_dir: Path) -> None:
    """Point a prepared submission's --script at RUN/code/... instead of the upload folder, and
    render again (the script was checked where it was uploaded)."""
    req = prepared.request
    if req.entry.kind == "script":
        rel = Path(req.entry.target).resolve().relative_to(code_dir.resolve())
        entry = dataclasses.replace(req.entry, target=str(prepared.run.path / "code" / rel))
        prepared.use(dataclasses.replace(req, entry=entry))


def install(run_path: Path, code_dir: Path) -> None:
    """Move the uploaded code into the new run folder (before its job is submitted)."""
    shutil.move(str(code_dir), str(run_path / "code"))

"""RunDir: one run folder per run name, stable across requeues and resumes (design.md "Run folder").

Runs are found by path, in a runs folder, or through a small index of created runs in the user's state
dir ($XDG_STATE_HOME/hpctrain/runs.jsonl), so `hpctrain status NAME` works from any directory.
Nothing here ever deletes a run folder: replacing a finished run moves the old folder aside.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
from pathlib import Path
from typing import Any

from hpctrain import __version__
from hpctrain.errors import UserError

FINISHED = "COMPLETED"
# Scheduler states after which nothing runs any more (Slurm's and the local script's names).
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "PREEMPTED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "LOST"}


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def runs_dir_of(profile: Any, cwd: Path | None = None) -> Path:
    """The profile's storage.runs_dir, with $VARS and ~ expanded here, made absolute."""
    raw = profile.storage.runs_dir or "./runs"
    expanded = os.path.expanduser(os.path.expandvars(raw))
    if "$" in expanded:
        raise UserError(f"storage.runs_dir {raw!r} uses a variable that is not set here; set it or "
                        "choose another runs_dir (the run folder must be known at submit time)")
    return Path(cwd or Path.cwd(), expanded).resolve()


def _index_file() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hpctrain" / "runs.jsonl"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash: skip it, keep the rest
        if isinstance(item, dict):
            out.append(item)
    return out


def _append_jsonl(path: Path, item: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(item, sort_keys=True) + "\n")


class RunDir:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).absolute()

    # -- paths ------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def run_yaml(self) -> Path:
        return self.path / "run.yaml"

    @property
    def job_sh(self) -> Path:
        return self.path / "job.sh"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def submitit(self) -> Path:
        return self.path / "submitit"

    def exists(self) -> bool:
        return self.run_yaml.is_file()

    # -- creating ---------------------------------------------------------------------------------
    def check_free(self, state: str | None, *, replace_finished: bool = False) -> None:
        """Refuse a name that is taken; `replace_finished` moves a COMPLETED run aside."""
        if not self.path.exists():
            return
        if not self.exists():
            raise UserError(f"{self.path} exists and is not a run folder (no run.yaml); choose another "
                            "--name or move that folder away")
        if state == FINISHED and replace_finished:
            return
        hint = (f"use `hpctrain resume {self.name}` to continue it, or another --name"
                if state != FINISHED else
                f"use another --name, or --replace-finished to move it aside and start again")
        raise UserError(f"run {self.name!r} already exists in {self.path.parent} (state {state or 'UNKNOWN'}); "
                        f"{hint}")

    def create(self, *, profile: Any, request: Any, script: str, replace_finished: bool = False,
               node_python: str | None = None) -> None:
        """Make the folder, freeze run.yaml and write job.sh. A COMPLETED run of the same name (only
        with replace_finished, checked by check_free) is renamed to NAME.old-<time>, never deleted."""
        import yaml

        if self.path.exists() and replace_finished:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            aside = self.path.with_name(f"{self.name}.old-{stamp}")
            self.path.rename(aside)
        self.path.mkdir(parents=True, exist_ok=False)
        self.logs.mkdir()
        frozen = {
            "hpctrain_version": __version__,
            "created": now(),
            "profile": profile.model_dump(mode="json"),
            "profile_source": str(profile.source) if getattr(profile, "source", None) else None,
            "request": request.to_dict(),
            "node_python": node_python,  # what job.sh runs on the nodes (render(..., python=))
        }
        self.run_yaml.write_text(yaml.safe_dump(frozen, sort_keys=True))
        self.write_script(script)
        _append_jsonl(_index_file(), {"name": self.name, "path": str(self.path), "time": now()})

    def write_script(self, script: str) -> None:
        tmp = self.job_sh.with_suffix(".sh.tmp")
        tmp.write_text(script)
        tmp.chmod(0o755)
        tmp.replace(self.job_sh)

    # -- reading ----------------------------------------------------------------------------------
    def frozen(self) -> dict[str, Any]:
        import yaml

        if not self.exists():
            raise UserError(f"{self.path} is not a run folder (no run.yaml)")
        return yaml.safe_load(self.run_yaml.read_text()) or {}

    def scheduler(self) -> str:
        return str(self.frozen().get("profile", {}).get("scheduler", "local"))

    def jobs(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.path / "jobs.jsonl")

    def add_job(self, job_id: str, *, kind: str, scheduler: str) -> None:
        _append_jsonl(self.path / "jobs.jsonl",
                      {"job_id": str(job_id), "kind": kind, "time": now(), "scheduler": scheduler})

    def last_job_id(self) -> str | None:
        """The job to ask about: the newest submission's (a chain's current segment)."""
        jobs = self.jobs()
        if jobs and jobs[-1].get("kind") == "chain":
            from hpctrain import chain

            return chain.current(self, chain.ids(self))
        return str(jobs[-1]["job_id"]) if jobs else None

    def restarts(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.path / "restarts.jsonl")

    def events(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.path / "events.jsonl")

    def local_state(self) -> dict[str, Any] | None:
        try:
            data = json.loads((self.path / "state.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def newest_checkpoint_step(self) -> int | None:
        """The step of checkpoints/latest (the newest verified checkpoint), or None."""
        try:
            name = (self.path / "checkpoints" / "latest").read_text().strip()
        except OSError:
            return None
        digits = name.rsplit("-", 1)[-1]
        return int(digits) if digits.isdigit() else None


def find_run(ref: str, runs_dir: Path | None = None) -> RunDir:
    """A run by folder path, by name in `runs_dir` (default ./runs), or by name in the index."""
    candidates = [Path(ref)]
    if "/" not in ref:
        candidates.append((runs_dir or Path("runs")) / ref)
    for c in candidates:
        if (c / "run.yaml").is_file():
            return RunDir(c.resolve())
    for item in reversed(_read_jsonl(_index_file())):
        if item.get("name") == ref and (Path(item.get("path", "")) / "run.yaml").is_file():
            return RunDir(item["path"])
    raise UserError(f"no run {ref!r} here ({shlex.quote(str(candidates[-1]))}) or in the run index; "
                    "give the run folder's path, or --runs-dir; `hpctrain runs` lists runs")


def all_runs(runs_dir: Path | None = None) -> list[RunDir]:
    """Runs in `runs_dir` (default ./runs) and in the index, oldest first, each once."""
    seen: dict[Path, RunDir] = {}
    base = runs_dir or Path("runs")
    if base.is_dir():
        for child in sorted(base.iterdir()):
            if (child / "run.yaml").is_file():
                seen.setdefault(child.resolve(), RunDir(child.resolve()))
    for item in _read_jsonl(_index_file()):
        p = Path(item.get("path", ""))
        if (p / "run.yaml").is_file():
            seen.setdefault(p.resolve(), RunDir(p.resolve()))
    return sorted(seen.values(), key=lambda r: r.run_yaml.stat().st_mtime)

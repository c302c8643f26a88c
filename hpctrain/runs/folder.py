"""RunDir: one run folder per run name, stable across requeues and resumes (design.md "Run folder").

Runs are found by path, in a runs folder, or through the run index of created runs in the user's state
dir (hpctrain/runs/index.py), so `hpctrain status NAME` works from any directory.
Nothing here ever deletes a run folder: replacing a finished run moves the old folder aside.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import os
import shlex
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hpctrain import __version__
from hpctrain.kernel import layout, states
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.files import read_jsonl, utc_now
from hpctrain.kernel.rundir import RunFolder, make_dirs, umask_of
from hpctrain.runs import chain, sweepdir
from hpctrain.runs import index as runindex
from hpctrain.runs.record import BrokenRun, Job, Parsed, RunRecord, jsonl, read, regular, shown

if TYPE_CHECKING:
    from hpctrain.jobs.request import JobRequest
    from hpctrain.profiles.resolved import ResolvedProfile

FINISHED = states.COMPLETED
TERMINAL = states.TERMINAL
FAILED_EARLY_STATES = states.FAILED_EARLY

now = utc_now  # the one clock (hpctrain/kernel/files.py)


def runs_dir_of(profile: ResolvedProfile, cwd: Path | None = None) -> Path:
    """The profile's storage.runs_dir, with $VARS and ~ expanded here, made absolute."""
    raw = profile.storage.runs_dir or "./runs"
    expanded = os.path.expanduser(os.path.expandvars(raw))
    if "$" in expanded:
        raise UserError(
            f"storage.runs_dir {raw!r} uses a variable that is not set here; set it or "
            "choose another runs_dir (the run folder must be known at submit time)"
        )
    try:
        return Path(cwd or Path.cwd(), expanded).resolve()
    except (OSError, RuntimeError) as e:
        raise UserError(
            f"storage.runs_dir {raw!r} cannot be resolved ({getattr(e, 'strerror', None) or e}, "
            "a symlink loop?); fix: point runs_dir at a real folder"
        ) from None


def _parse_jobs(path: str) -> list[Job]:
    return [job for line in jsonl(path) if (job := Job.of(line)) is not None]


def _yaml() -> ModuleType:
    """PyYAML, on first use: run.yaml is read and written here, but `logs`, `cancel` and `status`
    of a name that is no run here never touch it (yaml costs about as much as the rest of them)."""
    import yaml  # lazy: CLI start-up (the commands above import no yaml)

    return yaml


LOW_SPACE = 1 << 20  # a run folder needs at least this much room to start


class RunDir(RunFolder):
    """A run folder: reading it, and (through RunFolder) every write into it. run.yaml, jobs.jsonl
    and restarts.jsonl are parsed once for as long as they stay the same (record.Parsed)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self._at = f"{self.path}{os.sep}"  # the files read below, as text (`runs`: 10,000 runs)
        self._record = Parsed(self._at + layout.RUN_YAML, self._parse_record)
        self._jobs = Parsed(self._at + layout.JOBS, _parse_jobs)
        self._restarts = Parsed(self._at + layout.RESTARTS, jsonl)
        self._failed_early = False  # check_free's verdict, for create()
        self.moved_aside: Path | None = None  # create(): where a run of the same name went

    # -- paths ------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def run_yaml(self) -> Path:
        return self.path / layout.RUN_YAML

    @property
    def job_sh(self) -> Path:
        return self.path / layout.JOB_SH

    @property
    def logs(self) -> Path:
        return self.path / layout.LOGS

    @property
    def submitit(self) -> Path:
        return self.path / layout.SUBMITIT

    def exists(self) -> bool:
        return self.run_yaml.is_file()

    # -- creating ---------------------------------------------------------------------------------
    def check_writable(self) -> None:
        """The run folder can be created here: its nearest existing folder is a writable folder
        with room (what `submit --dry-run` checks without writing anything)."""
        p = self.path.parent
        while not os.path.lexists(p):
            p = p.parent
        why = None
        if not p.is_dir():
            why = f"{p} is not a folder"
        elif not os.access(p, os.W_OK | os.X_OK):
            why = f"{p} is not writable (read-only, or not yours)"
        else:
            try:
                free = shutil.disk_usage(p).free
            except OSError as e:
                free, why = 0, f"{p}: {e.strerror}"
            if why is None and free < LOW_SPACE:
                why = f"no space left in {p} ({free} bytes free)"
        if why:
            raise UserError(
                f"cannot write the run folder {self.path}: {why}; fix: choose another "
                "storage.runs_dir (--set storage.runs_dir=DIR) or free space there"
            )

    def check_free(self, state: str | None, *, replace_finished: bool = False) -> None:
        """Refuse a name that is taken; `replace_finished` moves a COMPLETED run aside."""
        self._failed_early = False
        if not os.path.lexists(self.path):
            return
        if not self.exists():
            raise UserError(
                f"{self.path} exists and is not a run folder (no run.yaml); choose another "
                "--name or move that folder away"
            )
        if state == FINISHED and replace_finished:
            return
        if self.failed_before_first_step(state):
            return  # nothing of value in it: create() moves it aside, logs and all
        hint = (
            f"use `hpctrain resume {self.name}` to continue it, or another --name"
            if state != FINISHED
            else "use another --name, or --replace-finished to move it aside and start again"
        )
        raise UserError(
            f"run {self.name!r} already exists in {self.path.parent} (state {state or states.UNKNOWN}); "
            f"{hint}"
        )

    def create(
        self,
        *,
        profile: ResolvedProfile,
        request: JobRequest,
        script: str,
        replace_finished: bool = False,
        node_python: str | None = None,
    ) -> None:
        """Make the folder, freeze run.yaml and write job.sh. A COMPLETED run of the same name (only
        with replace_finished, checked by check_free) is renamed to NAME.old-<time>, never deleted."""
        yaml = _yaml()
        self.moved_aside = None
        try:
            if self.path.exists() and (replace_finished or self.failed_before_first_step(None)):
                stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
                failed = self.failed_before_first_step(None)
                self.moved_aside = move_aside(
                    self.path, f"{self.name}.{'failed' if failed else 'old'}-{stamp}"
                )
            # level by level, 0700 (storage.share none) or 0750 (group); an existing runs_dir is kept
            self._mask = umask_of(getattr(profile.storage, "share", None))
            make_dirs(self.path, self._mask, last_exists_ok=False)
            make_dirs(self.logs, self._mask)
        except OSError as e:
            raise UserError(
                f"cannot create the run folder {self.path}: {e.strerror or e}; fix: choose "
                "another --name or storage.runs_dir, or free space there"
            ) from None
        frozen = {
            "hpctrain_version": __version__,
            "created": now(),
            "cwd": os.getcwd(),  # where relative entry arguments point (the job starts here)
            "profile": profile.model_dump(mode="json"),
            "profile_source": str(profile.source) if getattr(profile, "source", None) else None,
            "request": request.to_dict(),
            "node_python": node_python,  # what job.sh runs on the nodes (JobSpec.build(python=))
        }
        self.write(layout.RUN_YAML, yaml.safe_dump(frozen, sort_keys=True))
        self.write_script(script)
        runindex.record(self.name, self.path)

    def freeze(self, frozen: Mapping[str, object]) -> None:
        """Replace run.yaml (resume: a new request, the same run)."""
        yaml = _yaml()
        self.write(layout.RUN_YAML, yaml.safe_dump(dict(frozen), sort_keys=True))

    def write_script(self, script: str) -> None:
        self.write(layout.JOB_SH, script, mode=0o777 & ~self.mask())

    def failed_before_first_step(self, state: str | None) -> bool:
        """A run that failed before any training step (no step in metrics.jsonl, no checkpoint):
        its name may be used again; its folder (logs) is moved aside, never deleted. `state`
        None: the state recorded when check_free accepted it."""
        if state is not None:
            self._failed_early = (
                state in FAILED_EARLY_STATES
                and not self.newest_checkpoint_step()
                and not any("step" in r for r in read_jsonl(self.path / "metrics.jsonl"))
                and not any((self.path / "checkpoints").glob("step-*"))
            )
        return self._failed_early

    # -- reading ----------------------------------------------------------------------------------
    def record(self) -> RunRecord:
        """run.yaml, parsed once while it stays the same (one stat a call); BrokenRun when it
        is not a run's."""
        return self._record.get()

    def _parse_record(self, path: str) -> RunRecord:
        try:
            data = regular(path)
            text = None if data is None else data.decode()
        except (FileNotFoundError, NotADirectoryError):
            text = None
        except (OSError, UnicodeDecodeError) as e:
            raise _unreadable(path, getattr(e, "strerror", None) or type(e).__name__) from None
        if text is None:  # gone, or a folder or pipe of that name
            raise UserError(f"{self.path} is not a run folder (no run.yaml)")
        # the keys the record's fields read, from their lines (`runs` reads every run's
        # run.yaml); the whole file where they are not in hpctrain's shape, or when asked
        # (`resume`: record.request)
        doc, where = shown(text), Path(path)
        if doc is not None:
            try:
                return RunRecord.parse(doc, where, lambda: _load(text, where))
            except BrokenRun:
                pass  # the whole file's parse says what is wrong with it
        return RunRecord.parse(_load(text, where), where)

    def frozen(self) -> dict[str, object]:
        """run.yaml as a new mapping of its own, to change and freeze() again (resume)."""
        return copy.deepcopy(dict(self.record().document))

    def scheduler(self) -> str:
        return self.record().scheduler

    def jobs(self) -> list[Job]:
        """One per submission (record.Job: a line without a job id is none)."""
        return list(self._jobs.get())

    def add_job(self, job_id: str, *, kind: str, scheduler: str) -> None:
        self.append(
            layout.JOBS,
            {"job_id": str(job_id), "kind": kind, "time": now(), "scheduler": scheduler},
        )

    def last_job_id(self) -> str | None:
        """The job to ask about: the newest submission's (a chain's current segment)."""
        jobs = self.jobs()
        if jobs and jobs[-1].kind == chain.KIND:
            return chain.current(self, chain.ids(self))
        return jobs[-1].job_id if jobs else None

    def restarts(self) -> list[dict[str, object]]:
        """Every start of the batch script (restarts.jsonl), parsed once while it is the same."""
        return list(self._restarts.get())

    def events(self) -> list[dict[str, object]]:
        return jsonl(self._at + layout.EVENTS)

    def local_state(self) -> dict[str, Any] | None:  # Any: state.json, as the script writes it
        return self.json_object(layout.STATE)

    def json_object(self, rel: str) -> dict[str, Any] | None:  # Any: a JSON file, as written
        """The JSON object in file `rel` (state.json, mesh.json); None when there is none."""
        try:
            data = json.loads(read(self._at + rel))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def failure_reason(self) -> str | None:
        """Why the run stopped, in one line: the last `error: ...` line a rank or the batch script
        wrote, else, when the run folder's disk is full, that (with the newest checkpoint and the fix)."""
        found = None
        nodes, ranks = sorted(self.logs.glob("node-*.log")), sorted(self.logs.glob("rank-*.log"))
        if len(nodes) + len(ranks) > 64:  # a big run: node 0's and rank 0's (status' root cause
            nodes, ranks = nodes[:1], ranks[:1]  # names the rest; 9,000 tails were 147 MB)
        logs = [*nodes, *ranks, self.logs / "batch.log"]
        for log in logs:
            try:
                with open(log, "rb") as f:
                    f.seek(max(0, log.stat().st_size - 16384))
                    tail = f.read().decode(errors="replace")
            except OSError:
                continue
            for line in tail.splitlines():
                if line.startswith("error: ") or line.startswith("hpctrain: error: "):
                    found = line.split("error: ", 1)[1].strip()
        if found:
            return found
        try:
            free = shutil.disk_usage(self.path).free
        except OSError:
            return None
        if free >= LOW_SPACE:
            return None
        try:
            newest = (self.path / "checkpoints" / "latest").read_text().strip() or "none"
        except OSError:
            newest = "none"
        return (
            f"no space left in {self.path.parent} ({free} bytes free); newest verified checkpoint: "
            f"{newest}; fix: free space there, then `hpctrain resume {self.name}`"
        )

    def newest_checkpoint_step(self) -> int | None:
        """The step of checkpoints/latest (the newest verified checkpoint), or None."""
        name = read(f"{self._at}checkpoints{os.sep}latest").decode(errors="replace").strip()
        digits = name.rsplit("-", 1)[-1]
        return int(digits) if digits.isdigit() else None


def _load(text: str, path: Path) -> dict[str, object]:
    """run.yaml's text as a mapping, or BrokenRun saying why not."""
    yaml = _yaml()
    # libyaml's safe loader where it is built (10-20x faster), else the same loader in Python
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(text, Loader=loader)
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        raise _unreadable(path, type(e).__name__) from None
    if not isinstance(data, dict):
        raise BrokenRun(
            f"{path} is not a mapping: the run is broken; fix: restore run.yaml "
            "from a backup, or move the folder away"
        )
    return data


def _unreadable(path: str | Path, what: str) -> BrokenRun:
    return BrokenRun(
        f"{path} cannot be read ({what}): the run is broken; fix: restore "
        "run.yaml from a backup, or move the folder away"
    )


def find_run(ref: str, runs_dir: Path | None = None) -> RunDir:
    """A run by folder path, by name in `runs_dir` (default ./runs), or by name in the index."""
    runindex.check_ref(ref)
    candidates = [Path(ref)]
    if "/" not in ref:
        candidates.append((runs_dir or Path("runs")) / ref)
    for c in candidates:
        if (c / "run.yaml").is_file():
            return RunDir(c.resolve())
    head, sep, point = ref.rpartition("/")
    if sep and head and point:  # SWEEP/<index> or SWEEP/<point folder> (SWEEP a name or a path)
        found = sweepdir.find(head, runs_dir)
        where = sweepdir.point_dir(found, point) if found else None
        if where is not None and (where / "run.yaml").is_file():
            return RunDir(where)
    for item in reversed(runindex.entries()):
        if item.name == ref and (item.path / layout.RUN_YAML).is_file():
            return RunDir(item.path)
    raise UserError(
        f"no run {ref!r} here ({shlex.quote(str(candidates[-1]))}) or in the run index; "
        "give the run folder's path, or --runs-dir; `hpctrain runs` lists runs"
    )


def all_runs(runs_dir: Path | None = None) -> list[RunDir]:
    """Runs in `runs_dir` (default ./runs) and in the index, oldest first, each once. One stat of
    each run.yaml (it has the age too), and a folder's real path from the runs folder's (only a
    link is resolved on its own): `runs` lists 10,000 folders."""
    seen: dict[Path, tuple[float, RunDir]] = {}

    def add(where: Path) -> None:
        try:
            st = os.stat(f"{where}{os.sep}{layout.RUN_YAML}")
        except (OSError, ValueError):
            return
        if stat.S_ISREG(st.st_mode):
            seen.setdefault(where, (st.st_mtime, RunDir(where)))

    base = runs_dir or Path("runs")
    try:
        real = base.resolve()
        children = sorted(os.scandir(base), key=lambda e: e.name) if base.is_dir() else []
    except (OSError, RuntimeError):
        children = []
    for child in children:
        try:
            add(Path(os.path.realpath(child.path)) if child.is_symlink() else real / child.name)
        except (OSError, RuntimeError):
            continue  # a symlink loop or an unreadable entry is not a run
    for item in runindex.entries():
        try:
            add(item.path.resolve())
        except (OSError, RuntimeError, ValueError):
            continue
    return [run for _, run in sorted(seen.values(), key=lambda pair: pair[0])]


def move_aside(path: Path, name: str) -> Path:
    """Rename `path` to `name` in its folder, never onto something that exists (NAME-2, -3, ...)."""
    for i in range(1, 1000):
        aside = path.with_name(name if i == 1 else f"{name}-{i}")
        if os.path.lexists(aside):
            continue
        os.rename(path, aside)  # rename(2) would replace an empty folder: the check above keeps it
        return aside
    raise UserError(f"cannot move {path} aside: {name}-1..999 all exist; fix: clean them up")


def copy_aside(src: Path, name: str) -> Path:
    """Copy `src` to a new file `name` in its folder, created exclusively (NAME-2, ... if taken)."""
    for i in range(1, 1000):
        dst = src.with_name(name if i == 1 else f"{name}-{i}")
        try:
            with open(dst, "xb") as out:
                out.write(src.read_bytes())
        except FileExistsError:
            continue
        shutil.copystat(src, dst)
        return dst
    raise UserError(f"cannot copy {src} aside: {name}-1..999 all exist; fix: clean them up")

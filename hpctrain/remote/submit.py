"""`hpctrain submit` to a remote site: validate here, render and submit there.

1. The profile is resolved here (files, user config, flags) and the request checked against it,
   so a mistake is reported before anything is sent.
2. The site's folders are resolved on the login node (`$SCRATCH` is the site's, not this machine's).
3. The resolved profile (its runs_dir made absolute, without `login:`) and the code go to an upload
   folder on the site (`<workdir>/incoming/<name>-<random>/`) with rsync, else scp.
4. The site's hpctrain submits from there: it renders job.sh with the site's Python and paths,
   creates the run folder, moves the code into it as `code/` and hands job.sh to the site's Slurm.
5. This machine's run index records the host and the run folder; the upload folder is removed.
"""

from __future__ import annotations

import secrets
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from hpctrain.jobs.options import JobOptions
from hpctrain.jobs.request import JobRequest
from hpctrain.kernel.errors import UserError
from hpctrain.remote import index
from hpctrain.remote.code import Code, pack, pythonpath
from hpctrain.remote.site import Site
from hpctrain.remote.ssh import Login
from hpctrain.runs import chain

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

# Options of `submit` passed on as they are (the others are folded into the uploaded profile).
_PASS = (
    ("nodes", "--nodes"),
    ("gpus", "--gpus"),
    ("time_min", "--time"),
    ("strategy", "--strategy"),
    ("module", "--module"),
    ("params", "--params"),
    ("plan_model", "--model"),
    ("min_nodes", "--min-nodes"),
)
_FLAGS = (
    ("wait", "--wait"),
    ("dry_run", "--dry-run"),
    ("replace_finished", "--replace-finished"),
    ("chain", "--chain"),
)


def site_profile(
    profile: ResolvedProfile, runs_dir: str, *, code: Code | None = None, code_dir: str = ""
) -> dict[str, object]:
    """The resolved profile as a standalone file for the site: no chain, no login, an
    absolute runs_dir. With the code of a --module run: its import root (in `code_dir`, the run's
    code/ on the site) first on the job's PYTHONPATH."""
    data = profile.model_dump(mode="json")
    data.pop("login", None)
    data["extends"] = None
    data["storage"]["runs_dir"] = runs_dir
    if code is not None and code.root is not None:
        env = data["environment"].get("env") or {}
        data["environment"]["env"] = {**env, "PYTHONPATH": pythonpath(code_dir, code, env)}
    return data


def site_folders(site: Site, profile: ResolvedProfile) -> tuple[str, str]:
    """(workdir, runs_dir) as absolute paths on the login node, its variables expanded there."""
    login = site.login
    raw_runs = profile.storage.runs_dir or f"{login.workdir.rstrip('/')}/runs"
    workdir, runs_dir = site.expand(login.workdir, raw_runs)
    for raw, value in ((login.workdir, workdir), (raw_runs, runs_dir)):
        if "$" in value:
            raise UserError(
                f"{raw!r} uses a variable that is not set on {login.where}; fix: set it "
                "in the site's shell start-up, or use another path in the profile"
            )
    return workdir, runs_dir


def upload_profile(site: Site, profile: ResolvedProfile, incoming: str, runs_dir: str) -> None:
    """Only the resolved profile (doctor): the same standalone file submit sends."""
    with tempfile.TemporaryDirectory(prefix="hpctrain-upload-") as tmp:
        stage = Path(tmp)
        text = yaml.safe_dump(site_profile(profile, runs_dir), sort_keys=True)
        (stage / "profile.yaml").write_text(text)
        site.ssh.upload(stage, incoming)


def submit(
    o: JobOptions,
    profile: ResolvedProfile,
    *,
    command: str = "submit",
    extra: list[str] | None = None,
    echo: Callable[[str], None] = print,
) -> int:
    """Submit to the profile's login node; returns the site's exit code. `extra`: more options for
    the site's `submit` (sweep and chain options)."""
    assert profile.login is not None  # the CLI comes here only for a profile with `login:`
    login = Login.of(profile.login)
    site = Site(login)
    req = _request(o, profile)
    workdir, runs_dir = site_folders(site, profile)
    incoming = f"{workdir}/incoming/{req.name}-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="hpctrain-upload-") as tmp:
        stage = Path(tmp)
        code = pack(stage / "code", script=o.script, sync=o.sync, module=o.module)
        # a sweep's code/ is in its folder too
        data = site_profile(profile, runs_dir, code=code, code_dir=f"{runs_dir}/{req.name}/code")
        (stage / "profile.yaml").write_text(yaml.safe_dump(data, sort_keys=True))
        if code and code.warning:
            echo(f"warning: {code.warning}")
        tool = site.ssh.upload(stage, incoming)
    echo(
        f"site {login.where}: run folder {runs_dir}/{req.name}"
        + (f"; code {code.source} sent with {tool}" if code else "")
        + (
            f"; --module {o.module} imported from code/{code.root}"
            if code and code.root is not None
            else ""
        )
    )
    args = [command, *_site_args(o, req, code=code, incoming=incoming), *(extra or [])]
    try:
        rc = site.hpctrain([*args, "--", *req.args])
    finally:
        site.ssh.run(f"rm -rf {shlex.quote(incoming)}", check=False)  # only our own upload folder
    if rc == 0 and not o.dry_run:
        index.record(
            name=req.name,
            path=f"{runs_dir}/{req.name}",
            login=login.to_dict(),
            profile=profile.name,
            kind="sweep" if command == "sweep" else "run",
        )
    return rc


def _request(o: JobOptions, profile: ResolvedProfile) -> JobRequest:
    """The request checked here, before anything is sent (a chain: its first segment's time)."""
    time_min = o.time_min
    if o.chain:
        time_min = chain.plan(time_min or profile.slurm.default_time_min, profile)[0].time_min
    return JobRequest.build(
        profile,
        name=o.name,
        nodes=o.nodes,
        gpus=o.gpus,
        time_min=time_min,
        strategy=o.strategy,
        script=o.script,
        module=o.module,
        args=o.args,
        min_nodes=o.min_nodes,
        exclude=tuple(o.exclude or ()),
    )


def _site_args(o: JobOptions, req: JobRequest, *, code: Code | None, incoming: str) -> list[str]:
    """The site's `submit` options: the uploaded profile and code, the options passed on."""
    args = ["--profile", f"{incoming}/profile.yaml", "--name", req.name]
    for key, flag in _PASS:
        value = (
            getattr(req, key, None)
            if key in ("nodes", "gpus", "time_min", "strategy")
            else getattr(o, key)
        )
        if key == "time_min" and o.chain:
            value = o.time_min  # the whole time: the site plans the segments
        if value is not None:
            args += [flag, str(value)]
    for node in o.exclude or ():
        args += ["--exclude", node]
    if code:
        args += ["--code", f"{incoming}/code"]
        if code.script:
            args += ["--script", f"{incoming}/code/{code.script}"]
    args += [flag for key, flag in _FLAGS if getattr(o, key)]
    args += [f"--exclude={e}" for e in o.exclude or ()]
    return args

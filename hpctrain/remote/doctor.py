"""`hpctrain doctor --profile P` for a profile with `login:`: check the way to the site (SSH, the
site's Python and hpctrain, its Slurm commands), then run the site's own doctor with the profile."""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from hpctrain.remote.site import Site
from hpctrain.remote.ssh import Login, RemoteError
from hpctrain.remote.submit import site_folders, upload_profile

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

SLURM = ("sbatch", "squeue", "sacct", "scancel", "scontrol")


def doctor(profile: ResolvedProfile, args: list[str], echo: Callable[[str], None]) -> int:
    """Returns the exit code: the site doctor's, or 1 when the way there is broken."""
    assert profile.login is not None  # the CLI comes here only for a profile with `login:`
    site = Site(Login.of(profile.login))
    where = site.login.where
    info = site.probe()  # raises RemoteError (one line with the fix) when SSH itself fails
    echo(f"ok   ssh {where} (control connection, strict host key checking)")
    if info.get("python", "missing") == "missing":
        raise RemoteError(
            f"{where}: no Python at login.remote_python "
            f"{site.login.remote_python!r}; fix: set login.remote_python to the "
            "site's Python that has hpctrain installed"
        )
    echo(f"ok   python {info['python']} ({info.get('python_version', '?')})")
    if info.get("hpctrain", "missing") == "missing":
        raise RemoteError(
            f"{where}: hpctrain is not installed for {site.login.remote_python}; "
            f"fix: `{site.login.remote_python} -m pip install hpctrain` on the site"
        )
    echo(f"ok   hpctrain {info['hpctrain']} on the site")
    missing = [c for c in SLURM if info.get(c, "missing") == "missing"]
    if profile.scheduler == "slurm" and missing:
        echo(
            f"FAIL slurm commands missing on {where}: {', '.join(missing)}; fix: load the site's "
            "Slurm module in your shell start-up (~/.bashrc), or check the login host"
        )
        return 1
    workdir, runs_dir = site_folders(site, profile)
    echo(f"ok   run folders on the site: {runs_dir}")
    incoming = f"{workdir}/incoming/doctor-{secrets.token_hex(4)}"
    upload_profile(site, profile, incoming, runs_dir)
    try:
        return site.hpctrain(["doctor", "--profile", f"{incoming}/profile.yaml", *args])
    finally:
        site.ssh.run(f"rm -rf {shlex.quote(incoming)}", check=False)

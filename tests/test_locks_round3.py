"""Issue 33, finding 5's lock items: a lock covers every path that sets the same thing.

- `watchdog` exports TORCH_NCCL_ASYNC_ERROR_HANDLING and TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC; with it
  locked, an environment mapping may not set them (they would override its exports);
- torchrun's `--local-addr` (or a prefix torchrun expands to it) sets the rendezvous address: refused
  while `rendezvous` is locked, unless the lock holds launch.torchrun_args too (the admin's own);
- `--monitor-interval` is hpctrain's (in-job restarts), refused with its prefixes like `--max-restarts`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _trust_common import write

from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import ValidationError
from hpctrain.profiles import resolve, schema
from hpctrain.render import script

SITE = "name: site\nscheduler: local\n"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """site(yaml) -> the profile `site` in a site folder of its own."""

    def make(extra: str) -> str:
        write(tmp_path / "siteprof" / "site.yaml", SITE + extra)
        monkeypatch.setenv(jobenv.SITE_PATH, str(tmp_path / "siteprof"))
        return "site"

    return make


@pytest.mark.parametrize("name", sorted(schema.WATCHDOG_ENV))
@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize("mapping", ["environment.env", "network.env", "environment.task_env"])
def test_a_watchdog_lock_covers_the_variables_it_exports(site, name, whole, mapping) -> None:
    lock = "watchdog" if whole else schema.WATCHDOG_ENV[name]  # the section, or the one key
    prof = site(f"locked: [{lock}]\n")
    with pytest.raises(ValidationError, match=rf"{lock} is locked by profile .*site\.yaml"):
        resolve(prof, {f"{mapping}.{name}": "0"})
    with pytest.raises(ValidationError, match=rf"{lock} is locked by profile"):
        resolve(prof, {f"environment.env.APPTAINERENV_{name}": "0"})  # the same inside a container


def test_without_the_lock_the_watchdog_variables_stay_open(site) -> None:
    prof = site("locked: [watchdog.nccl_heartbeat_timeout_s]\n")  # the other key: not covered
    got = resolve(prof, {"environment.env.TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert got.environment.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_the_lock_table_is_what_the_script_exports_for_the_watchdog() -> None:
    """Every variable the rendered script exports from a watchdog key is in WATCHDOG_ENV, with
    that key (a new export without a row would be a lock hole)."""
    _, keys = script._environment(resolve("local"))
    exported = {name: key for name, key in keys.items() if key.startswith("watchdog.")}
    assert exported == schema.WATCHDOG_ENV


LOCAL_ADDR = ["--local-addr=$HOSTNAME", "--local_addr=n1", "--local-a=x", "--local", "--local-addr"]


@pytest.mark.parametrize("arg", LOCAL_ADDR)
@pytest.mark.parametrize("lock", ["rendezvous", "rendezvous.interface"])
def test_local_addr_is_refused_while_rendezvous_is_locked(site, arg, lock) -> None:
    prof = site(f"locked: [{lock}]\n")
    with pytest.raises(ValidationError, match=rf"--local-addr, which rendezvous decides.*{lock}"):
        resolve(prof, {"launch.torchrun_args": ["--numa-binding=exclusive", arg]})


def test_local_addr_stays_open_without_the_lock_and_for_the_locking_admin(site) -> None:
    assert resolve(site(""), {"launch.torchrun_args": ["--local-addr=$HOSTNAME"]}).name == "site"
    # the admin sets it and locks launch.torchrun_args with rendezvous: nobody else wrote it
    own = site(
        "launch:\n  torchrun_args: ['--local-addr=${HOSTNAME}i']\nlocked: [rendezvous, launch]\n"
    )
    assert resolve(own).launch.torchrun_args == ["--local-addr=${HOSTNAME}i"]
    with pytest.raises(ValidationError, match="is locked by profile"):
        resolve(own, {"launch.torchrun_args": ["--local-addr=elsewhere"]})


@pytest.mark.parametrize(
    "arg", ["--monitor-interval=60", "--monitor_interval=60", "--monitor", "--mon=1"]
)
def test_monitor_interval_is_hpctrains(arg) -> None:
    with pytest.raises(ValidationError, match=r"--monitor-interval.*noticed within 0\.5 s"):
        resolve("local", {"launch.torchrun_args": [arg]})

"""Site policy that profiles cannot undo: locks over every path that sets the same thing (the
watchdog's exported variables, torchrun's `--local-addr` under a rendezvous lock, hpctrain's own
`--monitor-interval`), YAML values that used to be tracebacks, policy options in every option
list, unreadable site folders (templates, trust through symlinks and publish: tests/test_trust.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _trust_common import cli, write

from hpctrain.jobs import exports
from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import UserError, ValidationError
from hpctrain.profiles import resolve, schema


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg"
    home.mkdir(mode=0o755)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.setenv(jobenv.PYTHON, "/opt/py/bin/python")
    return home


# --- locks cover every path that sets the same thing ----------------------------------------------

LOCKED_NET = (
    "name: site\nscheduler: slurm\nnetwork:\n  socket_ifname: ib0\n  env:\n    NCCL_IB_TC: '106'\n"
    "environment:\n  env:\n    NCCL_NET: IB\nslurm:\n  partition: gpu\n"
    "locked: [network, slurm.partition]\n"
)


@pytest.fixture
def locked_site(tmp_path, monkeypatch) -> Path:
    site = tmp_path / "siteprof"
    write(site / "site.yaml", LOCKED_NET)
    os.chmod(site, 0o755)
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    return site


@pytest.mark.parametrize(
    "key, value",
    [
        ("environment.env.NCCL_IB_TC", "0"),
        ("environment.env.NCCL_NET", "Socket"),
        ("network.env.NCCL_IB_TC", "1"),
        ("environment.env.FI_PROVIDER", "tcp"),
        ("scheduler", "local"),
    ],
)
def test_lock_covers_other_keys_from_a_flag(locked_site, key, value) -> None:
    with pytest.raises(ValidationError, match=r"is locked by profile .*site.yaml"):
        resolve("site", {key: value})
    assert resolve("site", {"environment.env.MY_VAR": "1"}).environment.env["MY_VAR"] == "1"
    assert (
        resolve("site", {"environment.env.NCCL_NET": "IB"}).name == "site"
    )  # the same value is fine


def test_lock_covers_other_keys_from_user_config_and_child(locked_site, isolated, tmp_path) -> None:
    write(
        isolated / "hpctrain" / "config.yaml",
        "overrides:\n  environment:\n    env:\n      NCCL_NET: Socket\n",
    )
    with pytest.raises(
        ValidationError, match=r"config.yaml:4: environment.env.NCCL_NET: network is locked"
    ):
        resolve("site")
    (isolated / "hpctrain" / "config.yaml").unlink()
    child = write(tmp_path / "child" / "c.yaml", "name: c\nextends: site\nscheduler: local\n")
    os.chmod(tmp_path / "child", 0o755)
    result = cli("profiles", "validate", str(child))
    assert (
        result.exit_code == 2 and "c.yaml:3: scheduler: slurm.partition is locked" in result.output
    )


def test_user_profile_shadowing_a_locked_site_profile_is_refused(locked_site, isolated) -> None:
    mine = write(isolated / "hpctrain" / "profiles" / "site.yaml", "name: site\nscheduler: local\n")
    with pytest.raises(UserError, match="would silently drop those locks"):
        resolve("site")
    rows = [r for r in json.loads(cli("profiles", "list", "--json").output) if r["name"] == "site"]
    assert rows[-1]["kind"] == "user" and "would silently drop those locks" in rows[-1]["error"]
    write(mine, "name: site\nextends: site\nenvironment: {env: {MY_VAR: '1'}}\n")
    assert resolve("site").network.socket_ifname == "ib0"  # building on it keeps the locks


# --- YAML values that used to be tracebacks -------------------------------------------------------


@pytest.mark.parametrize(
    "text, expect",
    [
        (
            "name: x\nscheduler: local\nslurm:\n  <<: {partition: a}\n",
            "x.yaml:4: slurm: the YAML merge key <<",
        ),
        (
            "name: x\nscheduler: local\nslurm:\n  max_nodes: " + "9" * 5000 + "\n",
            "x.yaml:4: slurm.max_nodes: the number",
        ),
        ("name: x\nscheduler: local\nslurm:\n  max_nodes: " + "9" * 30 + "\n", "larger than"),
        ('name: x\nscheduler: local\ndescription: "a\\x01b"\n', "x.yaml:3: description"),
        ('name: x\nscheduler: local\ndescription: "a\\ud800b"\n', "x.yaml:3: description"),
        ("name: x\nscheduler: local\nslurm:\n  gpu_mem_gib: .inf\n", "not a finite number"),
        (
            "name: x\nscheduler: local\nslurm:\n  default_time_min: 1:30\n",
            "x.yaml:4: slurm.default_time_min: '1:30' is not a whole number",
        ),
        (
            "name: x\nscheduler: local\nslurm:\n  exclusive: 'true'\n",
            "x.yaml:4: slurm.exclusive: 'true' is quoted text; "
            "fix: write true or false without quotes",
        ),
        (
            "name: x\nscheduler: local\nslurm:\n  max_nodes: '4'\n",
            "x.yaml:4: slurm.max_nodes: '4' is quoted text; "
            "fix: write a whole number without quotes",
        ),
    ],
)
def test_bad_yaml_values_are_located_errors(tmp_path, text, expect) -> None:
    path = write(tmp_path / "p" / "x.yaml", text)
    result = cli("profiles", "validate", str(path))
    assert result.exit_code == 2, result.output
    assert expect in result.output


def test_sexagesimal_is_text_in_env_values(tmp_path) -> None:
    path = write(
        tmp_path / "p" / "x.yaml", "name: x\nscheduler: local\nenvironment:\n  env:\n    T: 1:30\n"
    )
    assert resolve(str(path)).environment.env["T"] == "1:30"


@pytest.mark.parametrize(
    "value, expect",
    [
        ("slurm.max_nodes=" + "9" * 5000, "far too large"),
        ("environment.env.X=a\x01b", "control character"),
        ("environment.env.X=a\udcffb", "not valid Unicode"),
        ("environment.env.T=1:30", None),
        ("slurm=3", None),
    ],
)
def test_bad_set_values_are_one_line(value, expect) -> None:
    result = cli("render", "--profile", "local", "--name", "t", "--set", value)
    if expect is None:
        assert result.exit_code in (0, 2)
        if value.endswith("1:30"):
            assert 'export T="1:30"' in result.output
        return
    assert result.exit_code == 2 and expect in result.output and "command line" in result.output


def test_one_bad_file_does_not_break_profiles_list(tmp_path, monkeypatch) -> None:
    site = tmp_path / "site"
    write(site / "merge.yaml", "name: merge\n<<: {scheduler: local}\n")
    write(site / "digits.yaml", "name: digits\nslurm: {max_nodes: " + "9" * 5000 + "}\n")
    write(site / "good.yaml", "name: good\nscheduler: local\n")
    os.chmod(site, 0o755)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    monkeypatch.setenv(jobenv.SITE_PATH, f"{site}:{loop}:{tmp_path / 'missing'}")
    result = cli("profiles", "list", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["good"]["error"] is None
    assert "merge key" in rows["merge"]["error"] and "far too large" in rows["digits"]["error"]


# --- options that undo the site's policy, wherever an option list appears -------------------------

POLICY = [
    "--partition=debug",
    "--account=other",
    "--qos=high",
    "--export=NONE",
    "--mem-per-cpu=1",
    "--clusters=other",
    "--uid=0",
    "--oversubscribe",
    "--exclusive",
    "--env=NCCL_NET=Socket",
]


@pytest.mark.parametrize(
    "where", ["slurm.srun_args", "slurm.extra_sbatch", "environment.container.flags"]
)
@pytest.mark.parametrize("option", POLICY)
def test_policy_options_are_refused_in_every_option_list(tmp_path, where, option) -> None:
    if where == "slurm.extra_sbatch" and option.startswith("--env="):
        option = "--export-file=/tmp/x"
    container = "  container: {kind: pyxis, image: nvcr.io#nvidia/pytorch:24.05-py3, flags: [%s]}\n"
    body = {
        "slurm.srun_args": f"slurm:\n  srun_args: ['{option}']\n",
        "slurm.extra_sbatch": f"slurm:\n  extra_sbatch: ['{option}']\n",
        "environment.container.flags": "environment:\n" + container % f"'{option}'",
    }[where]
    path = write(tmp_path / "p" / "x.yaml", "name: x\nscheduler: slurm\n" + body)
    result = cli("profiles", "validate", str(path))
    assert result.exit_code == 2, result.output
    assert "hpctrain sets --" in result.output or "abbreviates" in result.output


@pytest.mark.parametrize(
    "body, expect",
    [
        ("environment: {env: {IFS: x}}", "IFS would change how the job script itself runs"),
        ("environment: {env: {BASH_ENV: /tmp/x}}", "BASH_ENV would change"),
        ("environment: {env: {LD_PRELOAD: /tmp/x.so}}", "LD_PRELOAD would change"),
        ("environment: {env: {ENV: /tmp/x}}", "ENV would change"),
        ("environment: {modules: ['-q']}", "not a module name"),
        ("environment: {container: {kind: apptainer, image: '-x'}}", "not starting with -"),
        ("environment: {container: {kind: shifter, image: a, modules: ['-x']}}", "not a name"),
    ],
)
def test_env_that_subverts_the_script_and_option_like_values_are_refused(
    tmp_path, body, expect
) -> None:
    path = write(tmp_path / "p" / "x.yaml", f"name: x\nscheduler: slurm\n{body}\n")
    result = cli("profiles", "validate", str(path))
    assert (
        result.exit_code == 2
        and "x.yaml:3: environment." in result.output
        and expect in result.output
    )
    flag = cli(
        "render", "--profile", "local", "--name", "t", "--set", "environment.env.BASH_ENV=/tmp/x"
    )
    assert flag.exit_code == 2 and "BASH_ENV would change" in flag.output


def test_unreadable_site_folder_is_a_row_not_a_crash(tmp_path, monkeypatch) -> None:
    """Root reads every folder, so the OS answer is stood in for: EACCES from listing the folder."""
    site = tmp_path / "locked-site"
    site.mkdir(mode=0o700)
    real_iterdir = Path.iterdir

    def iterdir(self):
        if self == site:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    rows = json.loads(cli("profiles", "list", "--json").output)
    assert any(
        "cannot read search folder" in (r["error"] or "") and "Permission denied" in r["error"]
        for r in rows
    )
    assert any(r["name"] == "local" and r["error"] is None for r in rows)
    assert resolve("local").name == "local"


def test_lock_covers_per_task_environment_too(locked_site) -> None:
    with pytest.raises(ValidationError, match="network is locked"):
        resolve("site", {"environment.task_env.NCCL_NET": "Socket"})


# --- a lock covers what the watchdog exports, --local-addr under rendezvous, --monitor-interval -----

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
    keys = {e.name: e.key for e in exports.exports(resolve("local"))}
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

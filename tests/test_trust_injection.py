"""Values that would smuggle shell syntax or options into the rendered script, or a file past the
trust check (the second red team's findings, issue 20, item 4): shell syntax in `${NAME:-default}`,
prefixes of owned options, defaults that look like options, a site folder of the user's own, the
SSH control folder, container prefixes and flags under locks, bash's own switches, `login.host`.
Each is refused with one located line and exit 2 (the inputs that were tracebacks:
tests/test_bad_input.py; the preflight gate's container: tests/test_bad_nodes.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from _trust_common import cli, write

from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import UserError, ValidationError
from hpctrain.profiles import resolve


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


# --- High: shell syntax inside ${NAME:-default} ---------------------------------------------------


def test_two_quotes_in_user_config_defaults_are_refused_with_their_line(isolated, tmp_path) -> None:
    # before: accepted; in the double-quoted exports bash took each ' as a quote and swallowed
    # every export between them (locked ones included)
    write(
        isolated / "hpctrain" / "config.yaml",
        'overrides:\n  environment:\n    env:\n      A: "${U:-\'}"\n      Z: "${V:-\'}"\n',
    )
    with pytest.raises(
        ValidationError,
        match=r"config.yaml:4: environment.env.A: .*default of \$\{U:-...\} has \"'\"",
    ):
        resolve("local")
    out = cli("render", "--profile", "local", "--nodes", "1", "--name", "t")
    assert out.exit_code == 2 and re.search(r"config.yaml:4: environment.env.A: ", out.output)


@pytest.mark.parametrize(
    "key, value",
    [
        ("environment.env.X", "${U:-'}"),
        ("environment.env.X", "${U:-<(}"),
        ("environment.env.X", "${U:-a;b}"),
        ("environment.env.X", "${U:-a|b}"),
        ("environment.env.X", "${U:-(x)}"),
        ("environment.task_env.X", "${U:-'}"),
        ("network.env.NCCL_X", "${U:-&}"),
        ("storage.runs_dir", "${U:-'}/runs"),
        ("environment.activate", "${U:-<(}/venv"),
    ],
)
def test_shell_syntax_in_a_default_is_refused(key, value) -> None:
    with pytest.raises(
        ValidationError, match=rf"{re.escape(key)}: .*default of \$\{{U:-...\}} has"
    ):
        resolve("local", {key: value})


def test_plain_defaults_still_render() -> None:
    p = resolve(
        "local",
        {
            "environment.env.A": "${SCRATCH:-/tmp/x y}/a",
            "environment.env.B": "${FI:-cxi}",
            "environment.env.C": "${EMPTY:-}",
            "network.env.NCCL_SOCKET_FAMILY": "${F:-AF_INET}",
        },
    )
    assert p.environment.env["A"] == "${SCRATCH:-/tmp/x y}/a"


@pytest.mark.parametrize(
    "flags",
    [
        {
            "environment.container.kind": "apptainer",
            "environment.container.image": "/img.sif",
            "environment.container.binary": "${U:---export=ALL,LD_PRELOAD=/tmp/x.so}",
        },
        {"launch.python": "${P:--c}"},
        {"launch.torchrun": "${T:---standalone}"},
        {"launch.torchrun": "torchrun ${T:---nnodes=9}"},
        {"environment.container.kind": "apptainer", "environment.container.image": "${I:---x}"},
    ],
)
def test_a_default_starting_with_a_dash_is_refused_in_a_command_word(flags) -> None:
    with pytest.raises(ValidationError, match=r"starts with -, so the command would take it"):
        resolve("local", flags)


# --- abbreviations of owned options ---------------------------------------------------------------


@pytest.mark.parametrize(
    "option",
    [
        "--nnode=1",
        "--rdzv-endp=h:1",
        "--rdzv_endp=h:1",
        "--standalon",
        "--max-restart=7",
        "--nproc",
    ],
)
def test_torchrun_prefixes_of_owned_options_are_refused(option) -> None:
    with pytest.raises(ValidationError, match=r"torchrun reads --.* as --"):
        resolve("local", {"launch.torchrun_args": [option]})
    ok = resolve("local", {"launch.torchrun_args": ["--numa-binding=exclusive"]})
    assert ok.launch.torchrun_args == ["--numa-binding=exclusive"]


@pytest.mark.parametrize(
    "args", [["--run=/x"], ["--run-d", "/x"], ["--ru=/x"], ["--strat", "fsdp"], ["--s=fsdp"]]
)
def test_entry_prefixes_of_owned_and_shared_flags_are_refused(args) -> None:
    out = cli(
        "render", "--profile", "local", "--nodes", "1", "--name", "t", "--strategy", "ddp",
        "--", *args,
    )  # fmt: skip
    assert out.exit_code == 2 and "after `--`: the entry reads" in out.output, out.output


# --- a site folder of the user's own ----------------------------------------------------------------


def test_a_site_folder_the_user_owns_cannot_shadow_a_locked_site_profile(
    tmp_path, monkeypatch
) -> None:
    site = tmp_path / "site"
    write(site / "gpu.yaml", "name: gpu\nscheduler: local\nlocked: [scheduler]\n")
    mine = tmp_path / "mine"
    write(mine / "gpu.yaml", "name: gpu\nscheduler: local\n")
    os.chown(mine, 4321, 4321)
    os.chown(mine / "gpu.yaml", 4321, 4321)
    monkeypatch.setenv(jobenv.SITE_PATH, f"{site}:{mine}")
    monkeypatch.setattr(os, "getuid", lambda: 4321)  # the user who owns `mine`; `site` is root's
    with pytest.raises(UserError, match=r"would silently drop those locks"):
        resolve("gpu")
    write(mine / "gpu.yaml", "name: gpu\nextends: gpu\n")  # building on it keeps the lock
    os.chown(mine / "gpu.yaml", 4321, 4321)
    assert resolve("gpu").locked == ["scheduler"]


# --- the SSH control folder in a shared /tmp ---------------------------------------------------------


def test_ssh_control_folder_fallback_refuses_a_symlink(tmp_path, monkeypatch) -> None:
    from hpctrain.remote import ssh

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / ("long" * 20)))  # > 60 chars: fallback
    monkeypatch.setattr(ssh, "TMP", str(tmp_path))
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    (tmp_path / f"hpctrain-ssh-{os.getuid()}").symlink_to(theirs)
    with pytest.raises(UserError, match="not a folder private to you"):
        ssh.control_dir()
    (tmp_path / f"hpctrain-ssh-{os.getuid()}").unlink()
    made = ssh.control_dir()
    assert made.is_dir() and not made.is_symlink() and (made.stat().st_mode & 0o777) == 0o700


# --- containers: prefixed names and pyxis flags --------------------------------------------------------

LOCKED = (
    "name: site\nscheduler: slurm\nnetwork:\n  env:\n    NCCL_IB_TC: '106'\n"
    "environment:\n  container:\n    kind: pyxis\n    image: nvcr.io#nvidia/pytorch:24.05-py3\n"
    "locked: [network, environment.container]\n"
)


@pytest.fixture
def locked_site(tmp_path, monkeypatch) -> Path:
    write(tmp_path / "siteprof" / "site.yaml", LOCKED)
    monkeypatch.setenv(jobenv.SITE_PATH, str(tmp_path / "siteprof"))
    return tmp_path / "siteprof"


@pytest.mark.parametrize("prefix", ["APPTAINERENV_", "SINGULARITYENV_"])
def test_container_env_prefixes_are_checked_as_the_name_they_set(locked_site, prefix) -> None:
    with pytest.raises(ValidationError, match=r"is locked by profile"):
        resolve("site", {f"environment.env.{prefix}NCCL_IB_TC": "0"})
    with pytest.raises(ValidationError, match=rf"{prefix}LD_PRELOAD sets LD_PRELOAD inside"):
        resolve("local", {f"environment.env.{prefix}LD_PRELOAD": "/tmp/x.so"})
    with pytest.raises(ValidationError, match=r"has its own key; fix: set network.ib"):
        resolve("local", {f"environment.env.{prefix}NCCL_IB_DISABLE": "0"})
    with pytest.raises(ValidationError, match=r"is set by hpctrain's script"):
        resolve("local", {f"environment.task_env.{prefix}RANK": "0"})
    assert resolve("site", {f"environment.env.{prefix}MY_VAR": "1"}).name == "site"


@pytest.mark.parametrize(
    "flag", ["--container-writable", "--container-remap-root", "--container-mount-home"]
)
def test_pyxis_flags_belong_to_the_container_and_its_lock(locked_site, isolated, flag) -> None:
    with pytest.raises(ValidationError, match=r"environment.container.flags"):
        resolve("site", {"slurm.srun_args": [flag]})
    write(
        isolated / "hpctrain" / "config.yaml",
        f"overrides:\n  environment:\n    container:\n      flags: ['{flag}']\n",
    )
    with pytest.raises(ValidationError, match=r"environment.container is locked"):
        resolve("site")


@pytest.mark.parametrize("name", ["POSIXLY_CORRECT", "BASH_COMPAT", "EXECIGNORE", "FUNCNEST"])
def test_bash_switches_are_refused_in_environment_env(name) -> None:
    with pytest.raises(ValidationError, match=rf"{name} would change how the job script"):
        resolve("local", {f"environment.env.{name}": "1"})


@pytest.mark.parametrize("host", ["-Jevil@h", "-oProxyCommand=x", "-x@h"])
def test_login_host_may_not_look_like_an_ssh_option(tmp_path, host) -> None:
    path = write(
        tmp_path / "r" / "r.yaml", f"name: r\nscheduler: slurm\nlogin:\n  host: '{host}'\n"
    )
    out = cli("profiles", "validate", str(path))
    assert out.exit_code == 2 and "r.yaml:4: login.host: " in out.output, out.output

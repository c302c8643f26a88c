"""Trust, locks and bad input (issue 15): each red-team finding reproduced, then refused.

Templates and profiles pass one trust check (owner, group/world write, every folder above, symlink
targets, the folder they were found in); templates see plain data only and run in a bounded
sandbox; `locked:` is a list or an error; a lock covers every key that sets the same thing; bad
YAML values are one located line, never a traceback. docs/security.md describes the model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.errors import UserError, ValidationError
from hpctrain.kernel import jobenv
from hpctrain.profiles import resolve
from hpctrain.render import render
from hpctrain.request import JobRequest


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


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    if result.exit_code not in (0, 2):
        raise AssertionError(f"exit {result.exit_code}: {result.output}\n{result.exception!r}")
    return result


def site_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, files: dict[str, str] | None = None
) -> Path:
    site = tmp_path / "site"
    write(site / "templates" / "sbatch.sh.j2", '{% extends "hpctrain/sbatch.sh.j2" %}\n' + body)
    for name, text in (files or {}).items():
        write(site / "templates" / name, text)
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    return site


def render_local(**flags: object) -> str:
    profile = resolve("local", dict(flags))
    req = JobRequest.build(profile, name="t", nodes=1)
    return render(profile, req, "/tmp/runs/t")


# --- templates: trust for every template loaded, plain data only ----------------------------------


def test_template_gets_plain_data_and_cannot_touch_files(tmp_path, monkeypatch) -> None:
    victim = write(tmp_path / "victim.txt", "keep")
    site_template(
        tmp_path,
        monkeypatch,
        "{% block setup %}{{ super() | safe }}# {{ profile.source.unlink() }}\n{% endblock %}\n",
    )
    # the red team's file: profile.source was a Path; now it is text, so the call is undefined
    monkeypatch.setattr("hpctrain.profiles.schema.Profile.source", property(lambda self: victim))
    result = cli("submit", "--profile", "local", "--name", "t", "--dry-run")
    assert result.exit_code == 2 and "template" in result.output and "unlink" in result.output
    assert victim.read_text() == "keep"

    from hpctrain import templating
    from hpctrain.render import context

    profile = resolve("local")
    ctx = templating.plain(context(profile, JobRequest.build(profile, name="t"), "/r"))

    def kinds(v):
        if isinstance(v, dict):
            return set().union(*[kinds(x) for x in v.values()], {dict})
        if isinstance(v, list):
            return set().union(*[kinds(x) for x in v], {list})
        return {type(v)}

    assert kinds(ctx) <= {dict, list, str, int, float, bool, type(None)}


def test_template_sees_source_and_chain_as_text(tmp_path, monkeypatch) -> None:
    site_template(
        tmp_path,
        monkeypatch,
        "{% block setup %}{{ super() | safe }}"
        "# {{ profile.source.upper() | safe }} {{ profile.chain | length }}\n{% endblock %}\n",
    )
    assert "/SITE_CONFIGS/LOCAL.YAML 1\n" in render_local()


@pytest.mark.parametrize("how", ["include", "extends-chain", "import"])
def test_every_template_loaded_is_trust_checked(tmp_path, monkeypatch, how) -> None:
    if how == "include":
        body, files = (
            '{% block setup %}{% include "inc.sh" %}{% endblock %}\n',
            {"inc.sh": "echo inc\n"},
        )
    elif how == "import":
        body, files = (
            '{% import "m.j2" as m %}{% block setup %}{{ m.x() | safe }}{% endblock %}\n',
            {"m.j2": "{% macro x() %}echo m{% endmacro %}"},
        )
    else:
        body, files = "", {}
    site = site_template(tmp_path, monkeypatch, body, files)
    if how == "extends-chain":
        write(site / "templates" / "sbatch.sh.j2", '{% extends "mid.j2" %}\n')
        write(site / "templates" / "mid.j2", '{% extends "hpctrain/sbatch.sh.j2" %}\n')
    inner = {"include": "inc.sh", "import": "m.j2", "extends-chain": "mid.j2"}[how]
    render_local()  # trusted: renders
    os.chmod(site / "templates" / inner, 0o666)
    with pytest.raises(UserError, match=f"Refusing template .*{inner}"):
        render_local()


def test_symlink_in_templates_to_etc_passwd_is_refused(tmp_path, monkeypatch) -> None:
    site = site_template(
        tmp_path, monkeypatch, '{% block setup %}{% include "pw" %}{% endblock %}\n'
    )
    (site / "templates" / "pw").symlink_to("/etc/passwd")
    with pytest.raises(UserError, match="resolves to /etc/passwd, outside"):
        render_local()
    (site / "templates" / "sbatch.sh.j2").unlink()
    (site / "templates" / "sbatch.sh.j2").symlink_to("/etc/passwd")
    with pytest.raises(UserError, match="outside"):
        render_local()


def test_site_folder_above_templates_is_checked(tmp_path, monkeypatch) -> None:
    site = site_template(tmp_path, monkeypatch, "")
    render_local()
    for folder in (site, site / "templates"):
        os.chmod(folder, 0o777)
        with pytest.raises(UserError, match=f"Bad permissions 0777 on folder {folder}:"):
            render_local()
        os.chmod(folder, 0o755)


def test_template_of_another_owner_is_refused(tmp_path, monkeypatch) -> None:
    site = site_template(tmp_path, monkeypatch, "")
    os.chown(site / "templates" / "sbatch.sh.j2", 65534, 65534)
    with pytest.raises(UserError, match="Bad owner .uid 65534"):
        render_local()


@pytest.mark.parametrize(
    "expr, what",
    [
        ("{% for i in range(10**9) %}{% endfor %}", "range of 1000000000"),
        ("{{ 'x' * 10**10 }}", "characters"),
        ("{{ 'x' * 999999 + 'y' * 999999 }}", "longer than"),
        ("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", "recursion"),
        ("{{ 1 // 0 }}", "ZeroDivisionError"),
        ("{{ 10 ** 10 ** 10 }}", "too large"),
        ("{{ '%999999999d' % 1 }}", "width"),
        ("{{ '{:999999999}'.format(1) }}", "str.format"),
        ("{{ '%999999999d' | format(1) }}", "width"),
    ],
)
def test_runaway_templates_are_one_clear_error(tmp_path, monkeypatch, expr, what) -> None:
    site_template(tmp_path, monkeypatch, "{% block setup %}" + expr + "{% endblock %}\n")
    result = cli("render", "--profile", "local", "--name", "t")
    assert result.exit_code == 2, result.output
    assert "template" in result.output and what in result.output
    assert "sbatch.sh.j2:" in result.output


def test_foreign_jinja_cache_folder_is_not_used(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache" / "hpctrain" / "jinja"
    cache.mkdir(parents=True)
    os.chown(cache, 65534, 65534)
    os.chmod(cache, 0o777)
    assert "#!/bin/bash" in render_local()
    assert list(cache.iterdir()) == []  # nothing read from or written to it
    os.chown(cache, 0, 0)
    os.chmod(cache, 0o700)
    render_local()
    assert list(cache.iterdir())  # ours and private: used


# --- locked: must be a list -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, kind",
    [
        ("slurm.account", "text"),
        ("{slurm: account}", "mapping"),
        ("3", "int"),
        ("[slurm.acount]", "not a profile key"),
        ("[3]", "not a dotted key"),
    ],
)
def test_malformed_locked_is_an_error_with_its_line(tmp_path, value, kind) -> None:
    path = write(tmp_path / "p" / "x.yaml", f"name: x\nscheduler: local\nlocked: {value}\n")
    result = cli("profiles", "validate", str(path))
    assert result.exit_code == 2
    assert "x.yaml:3: locked" in result.output and kind in result.output


# --- trust through symlinks and ancestors ---------------------------------------------------------


def test_world_writable_ancestor_is_refused(tmp_path) -> None:
    a = tmp_path / "a"
    path = write(a / "sub" / "t.yaml", "name: t\nscheduler: local\n")
    os.chmod(a / "sub", 0o755)
    os.chmod(a, 0o777)
    with pytest.raises(UserError, match=f"Bad permissions 0777 on folder {a}:"):
        resolve(str(path))
    os.chmod(a, 0o1777)  # sticky, like /tmp: entries cannot be swapped
    assert resolve(str(path)).name == "t"


def test_profile_through_a_symlink_in_a_world_writable_folder(tmp_path) -> None:
    real = write(tmp_path / "safe" / "t.yaml", "name: t\nscheduler: local\n")
    os.chmod(tmp_path / "safe", 0o755)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    (open_dir / "t.yaml").symlink_to(real)
    os.chmod(open_dir, 0o777)
    with pytest.raises(UserError, match=f"0777 on folder {open_dir}"):
        resolve(str(open_dir / "t.yaml"))
    os.chmod(open_dir, 0o755)
    assert resolve(str(open_dir / "t.yaml")).name == "t"
    os.chmod(real, 0o666)  # the target is checked too
    with pytest.raises(UserError, match=f"0666 on file {real}"):
        resolve(str(open_dir / "t.yaml"))


def test_site_path_that_is_a_symlink_in_a_world_writable_folder(tmp_path, monkeypatch) -> None:
    write(tmp_path / "site" / "t.yaml", "name: t\nscheduler: local\n")
    os.chmod(tmp_path / "site", 0o755)
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    (open_dir / "link").symlink_to(tmp_path / "site")
    monkeypatch.setenv(jobenv.SITE_PATH, str(open_dir / "link"))
    assert resolve("t").name == "t"
    os.chmod(open_dir, 0o777)
    with pytest.raises(UserError, match=f"0777 on folder {open_dir}"):
        resolve("t")


def test_publish_under_umask_000_creates_private_parents(tmp_path) -> None:
    src = write(tmp_path / "src" / "mine.yaml", "name: mine\nscheduler: local\n")
    os.chmod(tmp_path / "src", 0o755)
    old = os.umask(0)
    try:
        result = cli("profiles", "publish", str(src), "--to", str(tmp_path / "a" / "b" / "c"))
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    for d in ("a", "a/b", "a/b/c"):
        assert (tmp_path / d).stat().st_mode & 0o777 == 0o755, d
    assert (tmp_path / "a/b/c/mine.yaml").stat().st_mode & 0o777 == 0o644


def test_publish_over_a_folder_or_into_a_read_only_mount(tmp_path) -> None:
    src = write(tmp_path / "src" / "mine.yaml", "name: mine\nscheduler: local\n")
    os.chmod(tmp_path / "src", 0o755)
    to = tmp_path / "to"
    (to / "mine.yaml").mkdir(parents=True)
    result = cli("profiles", "publish", str(src), "--to", str(to), "--force")
    assert result.exit_code == 2 and "is a folder" in result.output
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o755)
    assert os.system(f"mount -t tmpfs -o size=64k,ro,mode=0755 tmpfs {ro}") == 0
    try:
        result = cli("profiles", "publish", str(src), "--to", str(ro))
        assert result.exit_code == 2 and "cannot publish" in result.output, result.output
        assert "Read-only file system" in result.output
    finally:
        os.system(f"umount {ro}")


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
        ("name: x\nscheduler: local\nslurm:\n  default_time_min: 1:30\n", "(got '1:30')"),
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

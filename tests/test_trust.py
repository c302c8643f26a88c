"""Trust, locks and bad input (issue 15): each red-team finding reproduced, then refused.

Templates and profiles pass one trust check (owner, group/world write, every folder above, symlink
targets, the folder they were found in); templates see plain data only and run in a bounded
sandbox; `locked:` is a list or an error; a lock covers every key that sets the same thing; bad
YAML values are one located line, never a traceback. docs/security.md describes the model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _trust_common import cli, render_local, site_template, write

from hpctrain.jobs.request import JobRequest
from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import UserError
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

    from hpctrain.jobs.spec import JobSpec
    from hpctrain.render import templating
    from hpctrain.render.script import context

    profile = resolve("local")
    ctx = templating.plain(
        context(JobSpec.build(profile, JobRequest.build(profile, name="t"), "/r"))
    )

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

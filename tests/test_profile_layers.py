"""Site profiles: extends, layers and locks, the default profile, discovery and trust, show,
publish, help and docs (the shipped set and bad input: tests/test_profiles.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _profiles_common import REPO, SHIPPED, cli, invalid, write

from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import UserError, ValidationError
from hpctrain.profiles import discover, resolve


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No user config or site path from the machine running the tests."""
    home = tmp_path / "xdg"
    home.mkdir()
    os.chmod(home, 0o755)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    return home


# --- extends, layers, locks ----------------------------------------------------------------------


def test_extends_cycle_names_the_chain(tmp_path: Path) -> None:
    a = write(tmp_path / "p" / "a.yaml", "name: a\nextends: ./b.yaml\n")
    write(tmp_path / "p" / "b.yaml", "name: b\nextends: c.yaml\n")
    write(tmp_path / "p" / "c.yaml", "name: c\nextends: ./a.yaml\n")
    out = invalid(a)
    assert "extends forms a cycle" in out and "c.yaml:2: extends" in out
    assert out.index("a.yaml ->") < out.index("b.yaml ->") < out.index("c.yaml ->")


def test_extends_by_name_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    os.chmod(site, 0o755)
    write(site / "a.yaml", "name: a\nextends: b\n")
    write(site / "b.yaml", "name: b\nextends: a\n")
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    with pytest.raises(ValidationError, match="extends forms a cycle"):
        resolve("a")


def test_child_may_extend_a_profile_of_its_own_name(isolated: Path) -> None:
    write(
        isolated / "hpctrain" / "profiles" / "generic-ib.yaml",
        "name: generic-ib\nextends: generic-ib\nenvironment:\n  activate: /home/me/venv\n",
    )
    p = resolve("generic-ib")
    assert p.environment.activate == "/home/me/venv" and p.slurm.gpus_per_node == 8
    assert len(p.chain) == 2


def test_flags_and_user_config_layers_with_origins(isolated: Path) -> None:
    cfg = write(
        isolated / "hpctrain" / "config.yaml",
        "default_profile: ethernet\noverrides:\n  slurm:\n    qos: low\n    max_nodes: 4\n",
    )
    p = resolve(None, {"slurm.max_nodes": "2", "network.env.NCCL_DEBUG": "INFO"})
    assert p.name == "ethernet"
    assert (p.slurm.qos, p.slurm.max_nodes, p.network.env["NCCL_DEBUG"]) == ("low", 2, "INFO")
    assert p.origins["slurm.qos"] == f"user config {cfg}:4"
    assert p.origins["slurm.max_nodes"] == "flag slurm.max_nodes"
    assert p.origins["network.env.NCCL_DEBUG"] == "flag network.env.NCCL_DEBUG"
    assert p.network.env["NCCL_SOCKET_NTHREADS"] == "4"  # mappings merge key by key
    assert p.origins["slurm.reservation"] == "default"


def test_bad_flag_and_bad_user_config(isolated: Path) -> None:
    with pytest.raises(ValidationError) as e:
        resolve("local", {"slurm.gpus_per_nod": 2})
    assert "command line: slurm.gpus_per_nod: unknown key; did you mean 'gpus_per_node'?" in str(
        e.value
    )
    cfg = write(
        isolated / "hpctrain" / "config.yaml",
        "default_profil: local\noverrides:\n  slurm:\n    mem: lots\n",
    )
    with pytest.raises(ValidationError) as e:
        resolve("local")
    msg = str(e.value)
    assert f"{cfg}:1: default_profil: unknown key; did you mean 'default_profile'?" in msg
    assert f"{cfg}:4: slurm.mem: 'lots' is not a Slurm memory size" in msg


def test_locked_key_override_names_key_and_profile(isolated: Path, tmp_path: Path) -> None:
    ib = str((REPO / "site_configs" / "generic-ib.yaml").resolve())
    with pytest.raises(ValidationError) as e:
        resolve("generic-ib", {"slurm.account": "other"})
    assert f"slurm.account is locked by profile {ib}" in str(e.value)
    assert resolve("generic-ib", {"slurm.account": "ml-research"}).slurm.account == "ml-research"

    child = write(
        tmp_path / "p" / "child.yaml",
        "name: child\nextends: generic-ib\nslurm:\n  partition: big\n",
    )
    out = invalid(child)
    assert f"{child}:4: slurm.partition: slurm.partition is locked by profile {ib}" in out

    cfg = write(isolated / "hpctrain" / "config.yaml", "overrides:\n  slurm:\n    account: mine\n")
    with pytest.raises(ValidationError) as e:
        resolve("roce")
    assert f"{cfg}:3: slurm.account: slurm.account is locked by profile {ib}" in str(e.value)


def test_locked_section(tmp_path: Path) -> None:
    write(
        tmp_path / "p" / "base.yaml",
        "name: base\nnetwork:\n  socket_ifname: ib0\nlocked: [network]\n",
    )
    child = write(
        tmp_path / "p" / "child.yaml",
        "name: child\nextends: ./base.yaml\nnetwork:\n  env:\n    NCCL_DEBUG: INFO\n",
    )
    assert "network is locked by profile" in invalid(child)


def test_name_cannot_be_overridden_from_config(isolated: Path) -> None:
    write(isolated / "hpctrain" / "config.yaml", "overrides:\n  name: other\n  locked: []\n")
    with pytest.raises(ValidationError, match="name cannot be overridden"):
        resolve("local")


# --- default profile, discovery, trust -----------------------------------------------------------


def test_default_profile(isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert resolve(None).name == "local"  # no sbatch: the embedded default
    write(bin_dir / "sbatch", "#!/bin/sh\n", 0o755)
    with pytest.raises(UserError, match="pass --profile NAME .available: aws-efa, ethernet"):
        resolve(None)
    write(isolated / "hpctrain" / "config.yaml", "default_profile: loopback\n")
    assert resolve(None).name == "loopback"


def test_unknown_profile_name_suggests() -> None:
    with pytest.raises(UserError, match="no profile named 'loopbak'; did you mean 'loopback'"):
        resolve("loopbak")


def test_discovery_precedence(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site1, site2 = tmp_path / "site1", tmp_path / "site2"
    write(site1 / "local.yaml", "name: local\nscheduler: local\ndescription: site one\n")
    write(site2 / "local.yaml", "name: local\nscheduler: local\ndescription: site two\n")
    write(site2 / "extra.yml", "name: extra\nextends: local\nslurm: {gpus_per_node: 1}\n")
    for d in (site1, site2):
        os.chmod(d, 0o755)
    monkeypatch.setenv(jobenv.SITE_PATH, f"{site1}:{site2}")
    assert resolve("local").description == "site two"
    assert resolve("extra").description == "site two"  # extends by name finds the winner
    user = write(
        isolated / "hpctrain" / "profiles" / "local.yaml",
        "name: local\nscheduler: local\ndescription: mine\n",
    )
    assert resolve("local").description == "mine"
    entries = [e for e in discover() if e.name == "local"]
    assert [e.kind for e in entries] == ["bundled", "site", "site", "user"]
    assert [e.wins for e in entries] == [False, False, False, True]
    assert all(e.shadowed_by == user.resolve() for e in entries[:3])

    result = cli("profiles", "list", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert set(rows[0]) == {
        "name",
        "scheduler",
        "description",
        "path",
        "kind",
        "wins",
        "shadowed_by",
        "error",
    }
    local = [r for r in rows if r["name"] == "local"]
    assert [r["kind"] for r in local] == ["bundled", "site", "site", "user"]
    assert local[-1] == {
        "name": "local",
        "scheduler": "local",
        "description": "mine",
        "path": str(user.resolve()),
        "kind": "user",
        "wins": True,
        "shadowed_by": None,
        "error": None,
    }
    assert {r["name"] for r in rows} >= set(SHIPPED) | {"extra"}
    table = cli("profiles", "list")
    assert table.exit_code == 0 and "shadowed by" in table.output and "site two" in table.output


def test_discovered_name_must_match_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "site" / "alpha.yaml", "name: beta\nscheduler: local\n")
    os.chmod(tmp_path / "site", 0o755)
    monkeypatch.setenv(jobenv.SITE_PATH, str(tmp_path / "site"))
    with pytest.raises(ValidationError, match="name 'beta' does not match the file name 'alpha'"):
        resolve("alpha")


@pytest.mark.parametrize("target", ["file", "dir"])
@pytest.mark.parametrize("bits", [stat.S_IWGRP, stat.S_IWOTH])
def test_writable_profile_is_refused(tmp_path: Path, target: str, bits: int) -> None:
    path = write(tmp_path / "p" / "x.yaml", "name: x\nscheduler: local\n")
    os.chmod(tmp_path / "p", 0o755)
    victim = path if target == "file" else path.parent
    os.chmod(victim, victim.stat().st_mode | bits)
    out = invalid(path)
    assert "Bad permissions" in out and f"chmod go-w {victim}" in out and "writable" in out
    with pytest.raises(UserError, match="Refusing profile"):
        resolve(str(path))


def test_writable_user_config_is_refused(isolated: Path) -> None:
    write(isolated / "hpctrain" / "config.yaml", "default_profile: local\n", 0o666)
    with pytest.raises(UserError, match="Bad permissions 0666"):
        resolve("local")


# --- show, publish, help, docs --------------------------------------------------------------------


def test_show_resolved_json_and_raw() -> None:
    result = cli("profiles", "show", "roce", "--resolved", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"name", "source", "chain", "values", "origins"}
    assert data["values"]["network"]["ib_gid_index"] == 3 and len(data["chain"]) == 2
    assert data["origins"]["slurm.partition"].endswith("generic-ib.yaml:10")
    raw = cli("profiles", "show", "roce")
    assert raw.exit_code == 0 and "extends: generic-ib" in raw.output
    table = cli("profiles", "show", "loopback", "--resolved")
    loopback = (REPO / "site_configs" / "loopback.yaml").read_text().splitlines()
    line = loopback.index("  partition: debug") + 1
    assert (
        table.exit_code == 0
        and "slurm.partition" in table.output
        and f"loopback.yaml:{line}" in table.output
    )
    bad = cli("profiles", "show", "nope")
    assert bad.exit_code == 2 and "no profile named 'nope'" in bad.output


def test_publish_is_atomic_and_safe(tmp_path: Path) -> None:
    src = write(
        tmp_path / "src" / "mine.yaml", "name: mine\nextends: generic-ib\ndescription: v1\n"
    )
    dest = tmp_path / "etc" / "profiles"
    result = cli("profiles", "publish", str(src), "--to", str(dest))
    assert result.exit_code == 0, result.output
    target = dest / "mine.yaml"
    assert target.read_bytes() == src.read_bytes()
    assert (
        stat.S_IMODE(target.stat().st_mode) == 0o644 and stat.S_IMODE(dest.stat().st_mode) == 0o755
    )
    assert "unchanged" in cli("profiles", "publish", str(src), "--to", str(dest)).output

    write(src, "name: mine\nextends: generic-ib\ndescription: v2\n")
    refused = cli("profiles", "publish", str(src), "--to", str(dest))
    assert refused.exit_code == 2 and "--force" in refused.output and b"v1" in target.read_bytes()

    with open(target, "rb") as old:  # a reader of the old file keeps the old file:
        assert cli("profiles", "publish", str(src), "--to", str(dest), "--force").exit_code == 0
        assert b"v1" in old.read()  # replaced by rename, never rewritten in place
    assert b"v2" in target.read_bytes() and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in dest.iterdir()) == ["mine.yaml"]  # no temp file left

    bad = write(tmp_path / "src" / "bad.yaml", "name: bad\nslurm: {gpus_per_node: -1}\n")
    assert cli("profiles", "publish", str(bad), "--to", str(dest)).exit_code == 2
    assert not (dest / "bad.yaml").exists()
    by_path = write(tmp_path / "src" / "rel.yaml", "name: rel\nextends: ./mine.yaml\n")
    out = cli("profiles", "publish", str(by_path), "--to", str(dest))
    assert out.exit_code == 2 and "extend by profile name" in out.output


@pytest.mark.parametrize("cmd", ["list", "show", "validate", "publish", "diff"])
def test_every_command_has_help_with_an_example(cmd: str) -> None:
    result = cli("profiles", cmd, "--help")
    assert result.exit_code == 0 and "Example" in result.output


def test_docs_match_the_schema() -> None:
    from hpctrain.profiles.docs import render

    committed = (REPO / "docs" / "site-profiles.md").read_text(encoding="utf-8")
    assert committed == render(), (
        "docs/site-profiles.md is out of date; refresh it with: "
        ".venv/bin/python -m hpctrain.profiles.docs > docs/site-profiles.md"
    )
    for key in ("slurm.gpu_request", "network.socket_ifname", "preemption.signal", "locked"):
        assert f"| `{key}` |" in committed


def test_design_doc_profile_shape_matches_the_schema() -> None:
    from hpctrain.profiles.docs import fill_design

    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    assert "<!-- generated: profile-keys -->" in design
    assert design == fill_design(design), (
        "docs/design.md's profile keys are out of date; refresh them with: make docs"
    )
    for line in ("launcher: torchrun | srun", "  port_min: int", "kind: "):
        assert line in design


def test_profiles_path_never_imports_torch() -> None:
    code = (
        "import sys; from hpctrain.cli import main; from hpctrain.profiles import resolve; "
        "main(['profiles', 'validate', 'site_configs/roce.yaml'], standalone_mode=False); resolve('loopback'); "
        "assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_null_resets_a_key_to_its_default(tmp_path: Path) -> None:
    child = write(
        tmp_path / "p" / "child.yaml",
        f"""\
name: child
extends: {REPO / "site_configs" / "generic-ib.yaml"}
slurm:
  extra_sbatch: null
  cpus_per_gpu: null
  cpus_per_task: 4
preemption:
  warning_s: null
environment:
""",
    )
    p = resolve(str(child))
    assert (p.slurm.extra_sbatch, p.slurm.cpus_per_gpu, p.slurm.cpus_per_task) == ([], None, 4)
    assert p.preemption.warning_s == 120 and p.origins["preemption.warning_s"] == f"{child}:8"
    assert p.environment.modules == [] and p.slurm.gpus_per_node == 8


def test_usr1_is_valid_but_warned(tmp_path: Path) -> None:
    path = write(tmp_path / "p" / "u.yaml", "name: u\npreemption:\n  signal: SIGUSR1\n")
    result = cli("profiles", "validate", str(path))
    assert result.exit_code == 0 and f"{path}: ok" in result.output
    assert "warning: preemption.signal USR1" in result.output
    assert resolve(str(path)).preemption.signal == "USR1"


def test_numbers_are_text_where_text_is_meant(tmp_path: Path) -> None:
    path = write(
        tmp_path / "p" / "n.yaml",
        "name: n\nversion: 3\nslurm:\n  mem: 0\nnetwork:\n  env:\n"
        "    NCCL_IB_TIMEOUT: 22\n    NCCL_DEBUG: true\n",
    )
    out = invalid(path)
    assert (
        "1 problem found" in out
        and f"{path}:8: network.env.NCCL_DEBUG: Input should be a valid string" in out
    )
    write(
        path, "name: n\nversion: 3\nslurm:\n  mem: 0\nnetwork:\n  env:\n    NCCL_IB_TIMEOUT: 22\n"
    )
    p = resolve(str(path))
    assert (p.version, p.slurm.mem, p.network.env["NCCL_IB_TIMEOUT"]) == ("3", "0", "22")


def test_missing_name_is_one_problem(tmp_path: Path) -> None:
    out = invalid(write(tmp_path / "p" / "x.yaml", "scheduler: local\n"))
    assert (
        "1 problem found" in out and "name: required key is missing; fix: add `name: NAME`" in out
    )


def test_bundled_profile_more_writable_than_the_code_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hpctrain.profiles.load as load

    bundle = tmp_path / "bundle"
    write(bundle / "local.yaml", "name: local\nscheduler: local\n", 0o666)
    monkeypatch.setattr("hpctrain.kernel.resources.bundled", lambda name: bundle)
    assert load._is_bundled(bundle / "local.yaml")
    with pytest.raises(UserError, match="Bad permissions 0666 on file"):
        resolve("local")
    os.chmod(bundle / "local.yaml", 0o644)
    assert resolve("local").scheduler == "local"


def test_list_shows_an_invalid_profile_without_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "site" / "broken.yaml", "name: broken\nslurm: {gpus_per_node: -1}\n")
    monkeypatch.setenv(jobenv.SITE_PATH, str(tmp_path / "site"))
    result = cli("profiles", "list", "--json")
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.output) if r["name"] == "broken")
    assert row["error"].endswith(
        "broken.yaml:2: slurm.gpus_per_node: Input should be greater than or equal "
        "to 0 (got -1); fix: use a larger value (counts cannot be negative)"
    )
    assert row["kind"] == "site" and row["scheduler"] is None
    assert "invalid" in cli("profiles", "list").output

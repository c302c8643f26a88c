"""The validated-profile cache (hpctrain/profiles/cache.py): a cached profile answers exactly as
the pydantic one, scripts render byte for byte the same, and the fast path imports no pydantic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import ValidationError
from hpctrain.profiles import Profile, cache, resolve
from hpctrain.profiles.cache import ProfileView

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p.stem for p in (REPO / "site_configs").glob("*.yaml"))


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg"
    home.mkdir(mode=0o755)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))  # generic-ib's runs_dir
    monkeypatch.setattr(cache, "ENABLED", True)
    return tmp_path


def facts(p: Profile) -> dict:
    return {
        "dump": p.model_dump(),
        "json": p.model_dump(mode="json"),
        "origins": p.origins,
        "source": p.source,
        "chain": p.chain,
        "warnings": p.warnings,
        "gloo_ifname": p.network.gloo_ifname,
        "env": p.environment.env,
        "slurm": p.slurm.model_dump(),
    }


def render(*args: str) -> str:
    result = CliRunner().invoke(main, ["render", *args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("name", SHIPPED)
def test_a_cached_profile_answers_as_the_validated_one(name: str, monkeypatch) -> None:
    flags = {"slurm.qos": "high", "environment.env.FOO": "1"}
    monkeypatch.setattr(cache, "ENABLED", False)
    plain = resolve(name, flags)
    assert not isinstance(plain, ProfileView)
    args = [
        "--profile",
        name,
        "--nodes",
        "2",
        "--name",
        "c",
        "--set",
        "slurm.qos=high",
        "--",
        "--max-steps",
        "5",
    ]
    want_script = render(*args)
    monkeypatch.setattr(cache, "ENABLED", True)
    miss = resolve(name, flags)
    hit = resolve(name, flags)
    assert not isinstance(miss, ProfileView) and type(hit) is ProfileView
    assert facts(hit) == facts(miss) == facts(plain)
    assert isinstance(hit, Profile) and hit.name == name
    assert render(*args) == render(*args) == want_script  # miss, then hit


def test_what_the_view_lacks_comes_from_pydantic() -> None:
    resolve("generic-ib")
    hit = resolve("generic-ib")
    assert type(hit) is ProfileView and hit._real is None
    copy = hit.model_copy()  # a method the cache does not hold
    assert type(copy).__name__ == "Profile" and copy.model_dump() == hit.model_dump()
    assert hit.model_dump(exclude={"slurm"}) == {
        k: v for k, v in hit.model_dump().items() if k != "slurm"
    }
    with pytest.raises(AttributeError, match="read-only"):
        hit.slurm.partition = "x"


def test_an_invalid_profile_is_never_cached(isolated: Path) -> None:
    bad = isolated / "site" / "bad.yaml"
    bad.parent.mkdir(mode=0o755)
    bad.write_text("name: bad\nslurm: {gpus_per_node: -1}\n")
    for _ in range(2):
        with pytest.raises(ValidationError, match="bad.yaml:2: slurm.gpus_per_node"):
            resolve(str(bad))
    bad.write_text("name: bad\nslurm: {gpus_per_node: 2}\n")  # fixed: a new text, a new key
    assert resolve(str(bad)).slurm.gpus_per_node == 2
    bad.write_text("name: bad\nslurm: {gpus_per_node: 3}\n")
    assert resolve(str(bad)).slurm.gpus_per_node == 3


def test_a_cache_file_others_can_write_is_ignored(isolated: Path) -> None:
    resolve("local")
    files = list((isolated / "cache" / "hpctrain" / "profiles").glob("*.json"))
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    for f in files:
        entry = json.loads(f.read_text())
        if "tree" in entry:  # a forged value, writable by others
            entry["tree"]["fields"]["name"]["value"] = "forged"
            f.write_text(json.dumps(entry))
            os.chmod(f, 0o666)
    p = resolve("local")
    assert p.name == "local" and type(p) is not ProfileView


def test_submit_dry_run_from_the_cache_imports_no_pydantic(isolated: Path) -> None:
    code = (
        "import sys\nfrom hpctrain.cli import main\n"
        "try:\n    main(['submit', '--profile', 'local', '--nodes', '2', '--name', 'x', "
        "'--dry-run', '--', '--max-steps', '3'])\nexcept SystemExit as e:\n    assert not e.code\n"
        "print('PYDANTIC', 'pydantic' in sys.modules)\n"
    )
    env = dict(os.environ, XDG_CACHE_HOME=str(isolated / "cache"))
    outs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            cwd=isolated,
            timeout=60,
        )
        for _ in range(2)
    ]
    assert all(o.returncode == 0 for o in outs), [o.stderr for o in outs]
    assert "PYDANTIC True" in outs[0].stdout  # first run: validated, then cached
    assert "PYDANTIC False" in outs[1].stdout  # second: from the cache
    assert "nothing was written" in outs[1].stdout


def test_a_bad_entry_config_is_refused_every_time(isolated: Path) -> None:
    """The submit-time check of train_entry's config is cached only when it passes."""
    args = [
        "submit",
        "--profile",
        "local",
        "--nodes",
        "2",
        "--gpus",
        "2",
        "--name",
        "b",
        "--dry-run",
        "--",
        "--train.global_batch=12",
    ]
    for _ in range(2):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and "global_batch(12) is not divisible" in result.output
    ok = [*args[:-1], "--train.global_batch=32"]
    for _ in range(2):
        result = CliRunner().invoke(main, ok)
        assert (
            result.exit_code == 0
            and "global batch 32 = world 4 x micro 8 x accum 1" in result.output
        ), result.output

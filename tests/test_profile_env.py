"""Profiles whose values name variables (issue 20, item 2): the rendered script, run by real bash
under its `set -u` (srun and the node python are stand-ins at the subprocess boundary, as in
tests/test_render.py), must never die with bash's bare "unbound variable".

- a variable the node does not have: the script reaches its state logic, a `failed` event and state
  FAILED, with one line naming the profile key (file:line), the variable and the fix;
- a value naming another export comes after it, whatever the names sort to; a cycle is refused at
  render time with its location;
- the profile's value of a variable the script derives itself wins, for every such variable.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_render import make_standins, run_script

from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import UserError, ValidationError
from hpctrain.profiles import resolve
from hpctrain.render.script import render

SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No user config, no site path but the test's own (as tests/test_render.py)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.setenv(jobenv.PYTHON, "/opt/hpctrain/bin/python")  # restored after render_p's


@pytest.fixture
def standins(tmp_path):
    return make_standins(tmp_path)


def site_profile(tmp_path, monkeypatch, text: str) -> Path:
    """A site folder on the site path holding profile `p.yaml` (so problems have a file:line)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "p.yaml").write_text(text)
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    return site / "p.yaml"


def render_p(tmp_path, standins, flags=None, name="p"):
    os.environ[jobenv.PYTHON] = str(standins[0] / "python")  # as tests/test_render.py does
    profile = resolve(name, {"preflight.enabled": False, **(flags or {})})
    req = JobRequest.build(profile, name="h", nodes=2, gpus=1, args=[])
    return render(JobSpec.build(profile, req, tmp_path / "runs" / "h"))


def events(tmp_path) -> list[dict]:
    f = tmp_path / "runs" / "h" / "events.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.is_file() else []


@pytest.mark.parametrize(
    "base, key, value",
    [
        ("local", "environment.env.NCCL_NET_PLUGIN_DIR", "${EBROOTNCCL}/lib"),
        ("loopback", "environment.env.LD_LIBRARY_PATH", "$EBROOTNCCL/lib:${LD_LIBRARY_PATH:-}"),
        ("loopback", "environment.container.mounts", "${EBROOTNCCL}/lib:/nccl"),
        ("local", "launch.python", "$EBROOTPYTHON/bin/python"),
    ],
)
def test_unset_variable_ends_failed_naming_key_variable_and_fix(
    base, key, value, tmp_path, standins, monkeypatch
):
    var = re.search(r"\$\{?([A-Z]+)", value).group(1)
    head, _, leaf = key.rpartition(".")
    body = {
        "environment.env": f"environment:\n  env:\n    {leaf}: '{value}'\n",
        "environment.container": (
            "environment:\n  container:\n    kind: pyxis\n    image: /i.sqsh\n"
            f"    mounts:\n      - '{value}'\n"
        ),
        "launch": f"launch:\n  python: '{value}'\n",
    }[head]
    site_profile(tmp_path, monkeypatch, f"name: p\nextends: {base}\n{body}")
    text = render_p(tmp_path, standins)
    out = run_script(text, standins, env=SLURM_ENV if base == "loopback" else None)
    log = tmp_path / "runs" / "h" / "logs" / "batch.log"
    said = out.stderr + (log.read_text() if log.is_file() else "")
    assert "unbound variable" not in said, said
    assert out.returncode == 1, said
    failed = [e for e in events(tmp_path) if e["event"] == "failed"]
    assert len(failed) == 1, said
    reason = failed[0]["reason"]
    line = {"environment.env": 5, "environment.container": 7, "launch": 4}[head]
    assert reason.startswith(f"{tmp_path}/site/p.yaml:{line}: {key} (profile p) uses ${var},"), (
        reason
    )
    assert "fix: set it before it is used" in reason and f"${{{var}:-}}" in reason, reason
    assert not (standins[1] / "node-0.json").exists()  # nothing launched
    if base == "local":
        assert json.loads((tmp_path / "runs" / "h" / "state.json").read_text())["state"] == "FAILED"
    # the same profile on a node that has the variable runs ($EBROOTPYTHON/bin/python: the stand-in)
    (tmp_path / "runs").rename(tmp_path / "runs-failed")
    has = {**(SLURM_ENV if base == "loopback" else {}), var: str(tmp_path)}
    out = run_script(text, standins, env=has)
    assert not [e for e in events(tmp_path) if e["event"] == "failed"], out.stderr


def test_exports_follow_the_exports_they_name_and_layers_keep_working(
    tmp_path, standins, monkeypatch
):
    site_profile(
        tmp_path,
        monkeypatch,
        "name: p\nextends: local\nenvironment:\n  env:\n"
        "    MIOPEN_CUSTOM_CACHE_DIR: ${MIOPEN_USER_DB_PATH}\n"
        "    MIOPEN_USER_DB_PATH: /tmp/miopen-$HOME\n",
    )
    # a user layer on top names the site's values too
    text = render_p(tmp_path, standins, {"environment.env.A_CACHE": "${MIOPEN_CUSTOM_CACHE_DIR}/a"})
    exports = re.findall(r"^(?:.*; )?export (\w+)=", text, flags=re.M)
    assert exports.index("MIOPEN_USER_DB_PATH") < exports.index("MIOPEN_CUSTOM_CACHE_DIR")
    assert exports.index("MIOPEN_CUSTOM_CACHE_DIR") < exports.index("A_CACHE")
    out = run_script(text, standins)
    assert out.returncode == 0, out.stderr
    env = json.loads((standins[1] / "node-0.json").read_text())["env"]
    home = str(tmp_path / "record").rsplit("/", 1)[0]
    assert env["MIOPEN_CUSTOM_CACHE_DIR"] == f"/tmp/miopen-{home}"
    assert env["A_CACHE"] == f"/tmp/miopen-{home}/a"


def test_a_reference_cycle_is_refused_at_render_time_with_its_location(tmp_path, monkeypatch):
    path = site_profile(
        tmp_path,
        monkeypatch,
        "name: p\nextends: local\nenvironment:\n  env:\n    B: ${A:-x}/b\n    A: $B/a\n"
        "    PATH: /opt/x/bin:$PATH\n",  # a value naming itself extends the node's: no cycle
    )
    profile = resolve("p")
    req = JobRequest.build(profile, name="h", nodes=1, gpus=1, args=[])
    with pytest.raises(UserError) as e:
        render(JobSpec.build(profile, req, tmp_path / "runs" / "h"))
    msg = str(e.value)
    assert msg.startswith(f"{path}:6: environment.env.A: ") or msg.startswith(
        f"{path}:5: environment.env.B: "
    ), msg
    assert "cycle" in msg and "fix:" in msg and "\n" not in msg
    # the CLI: one line, exit 2, no traceback
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", "render", "--profile", "p", "--nodes", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "cycle" in out.stderr and f"{path}:" in out.stderr


def derived_names() -> set[str]:
    """Every variable the bundled template (and the launcher/container parts) exports itself."""
    texts = [p.read_text() for p in sorted((REPO / "templates").rglob("*.j2"))]
    for name in ("loopback", "local"):
        for launcher in ("torchrun", "srun") if name == "loopback" else ("torchrun",):
            profile = resolve(name, {"launch.launcher": launcher})
            req = JobRequest.build(profile, name="h", nodes=2, gpus=1, args=[])
            texts.append(render(JobSpec.build(profile, req, "/r/h")))
    found = set()
    for text in texts:
        for names in re.findall(r"\bexport ((?:\w+=\S*\s*)+)", text):
            found |= set(re.findall(r"(\w+)=", names))
    return {n for n in found if not n.startswith(jobenv.PREFIX) and n == n.upper() and "{" not in n}


def test_the_profile_value_of_every_derived_variable_wins(tmp_path, standins, monkeypatch):
    names = derived_names()
    assert {"OMP_NUM_THREADS", "ACCELERATE_USE_CPU", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"} <= names
    accepted = {}
    for name in sorted(names):
        try:
            resolve("loopback", {f"environment.env.{name}": "7"})
        except ValidationError as e:  # refused: the message says which key sets it, or why not
            assert re.search(r"has its own key; fix: set \S+ instead|set by hpctrain", str(e)), e
            continue
        accepted[name] = f"7{len(accepted)}"
    assert "OMP_NUM_THREADS" in accepted and "ACCELERATE_USE_CPU" in accepted
    flags = {f"environment.env.{k}": v for k, v in accepted.items()}
    text = render_p(tmp_path, standins, {**flags, "slurm.cpus_per_task": 2}, name="loopback")
    for name, value in accepted.items():  # the batch shell: the admin's value is the last export
        batch = text.split("hpctrain_node_cmd='")[0]
        assert re.findall(rf"export {name}=(\S+)", batch)[-1] == f'"{value}"', name
    out = run_script(text, standins, env=SLURM_ENV)
    assert out.returncode == 0, out.stderr
    for node in (0, 1):  # and what the training processes see
        env = json.loads((standins[1] / f"node-{node}.json").read_text())["env"]
        assert {k: env.get(k) for k in accepted} == accepted

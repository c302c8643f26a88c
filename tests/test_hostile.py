"""Property test (issue 15): profiles, `--set` values, run names and entry arguments drawn
from hostile alphabets. For EVERY case, `hpctrain render` either
- exits 0 with a script that passes `bash -n` and, run with stand-in commands (srun, python, module,
  scontrol), executes nothing it was not meant to (no marker file appears) and hands the entry its
  arguments intact; or
- exits 2 with one located message (file:line: key, or `command line: key`, or the flag);
and never shows a traceback.

Fixed seed in CI (derandomize). Widen it by hand with a seed and more cases:
    .venv/bin/python -m pytest -q tests/test_hostile.py --hypothesis-seed=123 -p no:cacheprovider
    TRUST_CASES=20000 .venv/bin/python -m pytest -q tests/test_hostile.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctrain.cli import main
from hpctrain.kernel import jobenv

COUNT, RAN = [0], [0]
CASES = int(os.environ.get("TRUST_CASES", "1000"))
SEEDED = any(a.startswith("--hypothesis-seed") for a in sys.argv)
MARKS = Path(os.environ.get("TMPDIR", "/tmp")) / f"hpctrain-hostile-marks-{os.getpid()}"

# Fragments a red team types: every shell metacharacter, quotes, expansions, option-looking words,
# YAML specials, control characters, non-ASCII; the payload touches a marker file if it ever runs.
PAYLOADS = [
    "$(touch {m}/d)",
    "`touch {m}/b`",
    "; touch {m}/s",
    "\ntouch {m}/n",
    "' ; touch {m}/q ; '",
    '" ; touch {m}/dq ; "',
    "| touch {m}/p",
    "&& touch {m}/a",
    "${IFS}touch${IFS}{m}/i",
    "$'\\x41'",
    "$HOME",
    "${HOME}",
    "${X:-$(touch {m}/def)}",
    "${X:-'}",
    "${X:-<(}",
    "${X:---export=ALL}",
    "--partition=evil",
    "-rf",
    "--export=ALL",
    "#SBATCH --uid=0",
    "*",
    "?",
    "~root",
    "..",
    "../..",
    "\\",
    "%s%n",
    "{{ 7*7 }}",
    "{% raw %}",
    "<<: x",
    "!!python/object:os.system",
    "&a",
    "*a",
    "1:30",
    "'true'",
    "0x1f",
    "9" * 30,
    "\x00",
    "\x01",
    "\x7f",
    "\u202e",
    "\udcff",
    "ü✓",
    " ",
    "\t",
    "",
]
WORDS = [
    "a",
    "gpu",
    "x1",
    "NCCL_X",
    "p.q",
    "a-b",
    "A_B",
    "cuda/12.4",
    "/opt/x",
    "0",
    "-",
    "--",
    "=",
]


CHARS = list("$`'\"\\;&|<>(){}[]*?!#~ \n\t=-:,@%^") + [
    "\x00",
    "\x1b",
    "\u00a0",
    "\u2028",
    "é",
    "\U0001f600",
]


def hostile_text() -> st.SearchStrategy[str]:
    """One to three pieces: payloads, harmless words (so that many cases render) and single
    characters, joined; the payloads' {m} is the marker folder."""
    pieces = st.sampled_from(PAYLOADS + WORDS * 3 + CHARS)
    return (
        st.lists(pieces, min_size=1, max_size=3)
        .map("".join)
        .map(lambda s: s.replace("{m}", str(MARKS)))
    )


KEYS = [
    "slurm.partition",
    "slurm.account",
    "slurm.qos",
    "slurm.constraint",
    "slurm.reservation",
    "slurm.mem",
    "slurm.max_nodes",
    "slurm.exclusive",
    "slurm.default_time_min",
    "description",
    "scheduler",
    "environment.activate",
    "environment.env.HOSTILE",
    "environment.env.{k}",
    "network.env.NCCL_{k}",
    "network.socket_ifname",
    "network.gloo_socket_ifname",
    "preemption.signal",
    "preemption.warning_s",
    "rendezvous.port_min",
    "{k}",
    "slurm.{k}",
    "environment.env",
    "locked",
    "name",
]
FREE_TEXT = [
    "environment.env.HOSTILE",
    "environment.env.OTHER",
    "network.env.NCCL_HOSTILE",
    "description",
]
KEYS = KEYS + FREE_TEXT * 4
LIST_KEYS = ["slurm.extra_sbatch", "slurm.srun_args", "environment.modules", "locked"]


@st.composite
def case(draw) -> dict:
    suffix = st.sampled_from(["X", "A b", "1", "$X", "ÿ"])
    scalar_key = st.tuples(st.sampled_from(KEYS), suffix).map(lambda t: t[0].format(k=t[1]))
    value = st.one_of(hostile_text(), st.integers(-10, 10**6), st.booleans(), st.none())
    profile: dict = {"name": "hx", "extends": draw(st.sampled_from(["local", "loopback"]))}
    for key, v in draw(st.lists(st.tuples(scalar_key, value), max_size=3)):
        node = profile
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[last] = v
    for key, items in draw(
        st.lists(
            st.tuples(st.sampled_from(LIST_KEYS), st.lists(hostile_text(), max_size=2)), max_size=1
        )
    ):
        section, last = key.split(".") if "." in key else (None, key)
        node = profile.setdefault(section, {}) if section else profile
        if isinstance(node, dict):
            node[last] = items
    return {
        "profile": profile,
        "raw": draw(st.one_of(st.none(), st.none(), st.none(), st.none(), hostile_text())),
        "sets": draw(st.lists(st.tuples(scalar_key, hostile_text()), max_size=2)),
        "name": draw(
            st.one_of(st.sampled_from(["ok", "run-1", "a.b_c"]), hostile_text())
            if draw(st.booleans())
            else st.just("ok")
        ),
        "args": draw(st.lists(hostile_text(), max_size=3)),
    }


LOCATED = re.compile(
    r"(\.yaml:\d+: [\w.\[\]-]+: |command line: [^:]+: |<input>: --\w*|--name|--nodes|--set |"
    r"\.yaml:\d+: |\.yaml: )"
)

STANDINS = {
    "python": '#!/bin/bash\nif [ "$1" = -c ]; then exit 0; fi\n'
    'printf "%s\\0" "$@" >"$RECORD/argv-${' + jobenv.NODEID + ':-x}"\n',
    "srun": '#!/bin/bash\nwhile [ "${1#-}" != "$1" ]; do shift; done\n'
    'for ((i = 0; i < ${SLURM_NNODES:-1}; i++)); do SLURM_NODEID=$i "$@" & done; wait\n',
    "scontrol": '#!/bin/bash\nif [ "$1 $2" = "show hostnames" ]; then echo localhost; fi\n',
    "module": "#!/bin/bash\nexit 0\n",
    "getent": "#!/bin/bash\necho 127.0.0.1 STREAM localhost\n",
    "sleep": "#!/bin/bash\nexec /bin/sleep 0.01\n",  # the script's wait loop polls quickly
}
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    os.chmod(root, 0o755)
    bin_ = root / "bin"
    bin_.mkdir()
    for name, text in STANDINS.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    (root / "train.py").write_text("print('hi')\n")
    MARKS.mkdir(exist_ok=True)
    from hpctrain.profiles import cache

    was, cache.ENABLED = cache.ENABLED, False  # every case is a new profile: validate each directly
    yield root
    cache.ENABLED = was
    print(f"\nhostile cases: {COUNT[0]}, rendered and executed with stand-ins: {RAN[0]}")
    leftovers = list(MARKS.iterdir())
    for p in leftovers:
        p.unlink()
    MARKS.rmdir()
    assert leftovers == [], f"an injected command ran: {leftovers}"


@settings(
    max_examples=CASES,
    deadline=None,
    derandomize=not SEEDED,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(c=case())
def test_hostile_input_is_rendered_safely_or_refused_with_its_location(world, c) -> None:
    COUNT[0] += 1
    here = world / f"case-{COUNT[0]}"
    here.mkdir(mode=0o755)
    profile = dict(c["profile"], storage={"runs_dir": str(here / "runs")})
    text = yaml.safe_dump(profile, allow_unicode=True) if _dumpable(profile) else "name: hx\n"
    if c["raw"] is not None:
        text += c["raw"] + "\n"
    (here / "hx.yaml").write_text(text, errors="surrogateescape")
    os.chmod(here / "hx.yaml", 0o644)
    args = [
        "render",
        "--profile",
        str(here / "hx.yaml"),
        "--name",
        c["name"],
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--script",
        str(world / "train.py"),
    ]
    for key, value in c["sets"]:
        args += ["--set", f"{key}={value}"]
    args += ["--", *c["args"]]
    env = {
        "XDG_CONFIG_HOME": str(world / "config"),
        "XDG_CACHE_HOME": str(world / "cache"),
        "XDG_STATE_HOME": str(world / "state"),
        jobenv.PYTHON: str(world / "bin" / "python"),
    }
    out = CliRunner().invoke(main, args, env=env)
    assert "Traceback" not in out.output
    assert out.exit_code in (0, 2), f"exit {out.exit_code}: {out.output}\n{out.exception!r}"
    if out.exit_code == 2:
        assert isinstance(out.exception, SystemExit)
        assert LOCATED.search(out.output), out.output
        return
    script = here / "job.sh"
    script.write_text(out.output)
    record = here / "record"
    record.mkdir()
    run_env = {
        "PATH": f"{world / 'bin'}:/usr/bin:/bin",
        "RECORD": str(record),
        "HOME": str(here),
        **SLURM_ENV,
    }
    syntax = here / "bash-n.err"
    # one process: `bash -n` first (its complaint, if any, lands in bash-n.err), then the real run
    subprocess.run(
        [
            "/bin/bash",
            "-c",
            '/bin/bash -n "$1" 2>"$2" && /bin/bash "$1"',
            "check",
            str(script),
            str(syntax),
        ],
        env=run_env,
        capture_output=True,
        timeout=60,
        cwd=here,
    )
    assert syntax.read_text() == "", syntax.read_text()
    RAN[0] += 1
    assert list(MARKS.iterdir()) == [], "an injected command ran"
    argv = record / "argv-0"
    if argv.exists():  # the entry started: its arguments arrived intact
        got = argv.read_bytes().split(b"\0")[:-1]
        want = [a.encode("utf-8", "surrogateescape") for a in c["args"]]
        assert got[len(got) - len(want) :] == want or not want


def _dumpable(data) -> bool:
    try:
        yaml.safe_dump(data, allow_unicode=True).encode()
        return True
    except (yaml.YAMLError, UnicodeEncodeError):
        return False

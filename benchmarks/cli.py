"""5. CLI start-up: `hpctrain submit --dry-run`, `--help` and `profiles list` over
`python -c "import jinja2, yaml, click"` (target <= 1.5 each), the same for CPU instructions
(valgrind --tool=callgrind: repeatable on a shared machine), and `hpctrain render` of a 4,096-node
job (target under 1 s).

Both sides are fresh processes of the same interpreter, repetitions interleaved (A, B, A, B, ...);
a repetition's ratio is its A over its B. hpctrain's modules are byte-compiled first, as a wheel
install does (this checkout runs with PYTHONDONTWRITEBYTECODE, so an editable install would
recompile them at every start). The validated-profile cache (hpctrain/profiles/cache.py) is warm
after one untimed run, as it is for a user after their first command with a profile; the cold
first run is in the details. submit --dry-run validates the profile and request, renders the script
and says where it would go (local profile, 2 nodes x 1 worker). The 4,096-node render uses
benchmarks/profiles/large-ib.yaml (the shipped generic-ib profile with max_nodes 4096).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from benchmarks import common
from hpctrain.kernel import jobenv

HPCTRAIN = str(Path(common.PY).with_name("hpctrain"))
LARGE = str(common.BENCH / "profiles" / "large-ib.yaml")


def wall(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    common.run(cmd, timeout=120, cwd=cwd, extra_env=env)
    return time.perf_counter() - t0


def instructions(cmd: list[str], cwd: Path, env: dict[str, str]) -> int:
    """CPU instructions of one run under callgrind (no output file)."""
    p = common.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd],
        timeout=300,
        cwd=cwd,
        extra_env=env,
    )
    m = re.search(r"Collected\s*:\s*(\d+)", p.stderr)
    if not m:
        raise common.NotMeasured(f"no 'Collected' line from callgrind: {p.stderr[-300:]}")
    return int(m.group(1))


def slowest_imports(cmd: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    p = common.run([common.PY, "-X", "importtime", *cmd], timeout=120, cwd=cwd, extra_env=env)
    rows = []
    for line in p.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| ( *)(\S+)", line)
        if m and not m.group(2):  # top-level imports only, with their cumulative time
            rows.append((int(m.group(1)), m.group(3)))
    return [f"{name} {us / 1e6:.3f} s" for us, name in sorted(rows, reverse=True)[:6]]


def run(quick: bool) -> list[common.Row]:
    reps = common.reps(7 if quick else 11)
    cwd = common.scratch("cli-")
    env = {
        "XDG_CONFIG_HOME": str(cwd / "xdg"),
        "XDG_CACHE_HOME": str(cwd / "cache"),
        jobenv.SITE_PATH: "",
    }
    common.run([common.PY, "-m", "compileall", "-q", str(common.ROOT / "hpctrain")], timeout=120)
    base = [common.PY, "-c", "import jinja2, yaml, click"]
    dry = [
        HPCTRAIN,
        "submit",
        "--profile",
        "local",
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--name",
        "bench-dry",
        "--dry-run",
        "--",
        "--max-steps",
        "10",
    ]
    sides = {
        "submit --dry-run": dry,
        "--help": [HPCTRAIN, "--help"],
        "profiles list": [HPCTRAIN, "profiles", "list"],
    }
    names = {
        "submit --dry-run": "cli_submit_dry_run_vs_bare_imports",
        "--help": "cli_help_vs_bare_imports",
        "profiles list": "cli_profiles_list_vs_bare_imports",
    }
    rows = []
    try:
        cold = {k: wall(c, cwd, env) for k, c in sides.items()}  # fills the profile cache
        t: dict[str, list[float]] = {"imports": [], **{k: [] for k in sides}}
        for _ in range(reps):
            for k, c in (("imports", base), *sides.items()):
                t[k].append(wall(c, cwd, env))
        imports = slowest_imports(["-m", "hpctrain", *dry[1:]], cwd, env)
        b = common.median(t["imports"])
        for k in sides:
            per_rep = [x / y for x, y in zip(t[k], t["imports"], strict=True)]
            rows.append(
                common.settle(
                    names[k],
                    per_rep,
                    "<= 1.5",
                    reps=reps,
                    seconds=t[k],
                    bare_imports_s=t["imports"],
                    cold_first_run_s=cold[k],
                    slowest_imports=imports if k == "submit --dry-run" else None,
                    summary=f"`hpctrain {k}` {common.median(t[k]):.3f} s; bare imports {b:.3f} s "
                    f"(first run, profile cache cold: {cold[k]:.3f} s)",
                )
            )
    except common.NotMeasured as e:
        rows += [common.not_measured(n, "<= 1.5", str(e)) for n in names.values()]

    name = "cli_submit_dry_run_instructions_vs_bare_imports"
    if shutil.which("valgrind") is None:
        rows.append(common.not_measured(name, "<= 1.5", "valgrind is not installed"))
    else:
        try:
            n = min(reps, 3)  # instruction counts barely vary: 3 pairs show it
            ir: dict[str, list[int]] = {"imports": [], "dry": []}
            for _ in range(n):
                ir["imports"].append(instructions(base, cwd, env))
                ir["dry"].append(instructions(dry, cwd, env))
            per_rep = [x / y for x, y in zip(ir["dry"], ir["imports"], strict=True)]
            rows.append(
                common.settle(
                    name,
                    per_rep,
                    "<= 1.5",
                    reps=n,
                    instructions=ir,
                    summary=f"callgrind: submit --dry-run {common.median(ir['dry']) / 1e6:.0f} M "
                    f"instructions, bare imports {common.median(ir['imports']) / 1e6:.0f} M",
                )
            )
        except common.NotMeasured as e:
            rows.append(common.not_measured(name, "<= 1.5", str(e)))

    big = [
        HPCTRAIN,
        "render",
        "--profile",
        LARGE,
        "--nodes",
        "4096",
        "--name",
        "bench-big",
        "--",
        "--max-steps",
        "10",
    ]
    small = [
        HPCTRAIN,
        "render",
        "--profile",
        LARGE,
        "--nodes",
        "2",
        "--name",
        "bench-small",
        "--",
        "--max-steps",
        "10",
    ]
    try:
        wall(big, cwd, env)
        t = {"4096": [], "2": []}
        for _ in range(reps):
            t["4096"].append(wall(big, cwd, env))
            t["2"].append(wall(small, cwd, env))
        s4096, s2 = common.median(t["4096"]), common.median(t["2"])
        script = common.run(big, timeout=120, cwd=cwd, extra_env=env).stdout
        rows.append(
            common.settle(
                "cli_render_4096_nodes_seconds",
                t["4096"],
                "< 1.0",
                reps=reps,
                seconds=t,
                script_lines=len(script.splitlines()),
                summary=f"`hpctrain render --nodes 4096` (validate + render, process start included) "
                f"{s4096:.3f} s; 2 nodes {s2:.3f} s",
            )
        )
    except common.NotMeasured as e:
        rows.append(common.not_measured("cli_render_4096_nodes_seconds", "< 1.0", str(e)))
    return rows

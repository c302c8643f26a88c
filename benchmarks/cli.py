"""5. CLI: `hpctrain submit --dry-run` wall time over `python -c "import jinja2, yaml, click"`
(target <= 1.5), and `hpctrain render` of a 4,096-node job (target under 1 s, stated as measured).

Both sides are fresh processes of the same interpreter, repetitions interleaved, medians taken.
submit --dry-run validates the profile and request, renders the script and says where it would go
(local profile, 2 nodes x 1 worker). The 4,096-node render uses benchmarks/profiles/large-ib.yaml
(the shipped generic-ib profile with max_nodes 4096); a 2-node render beside it shows what scale
adds. The slowest imports of submit --dry-run (python -X importtime) are kept in the details.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from benchmarks import common

HPCTRAIN = str(Path(common.PY).with_name("hpctrain"))
LARGE = str(common.BENCH / "profiles" / "large-ib.yaml")


def wall(cmd: list[str], cwd: Path, **env: str) -> float:
    t0 = time.perf_counter()
    common.run(cmd, timeout=120, cwd=cwd, **env)
    return time.perf_counter() - t0


def slowest_imports(cmd: list[str], cwd: Path, **env: str) -> list[str]:
    p = common.run([common.PY, "-X", "importtime", *cmd], timeout=120, cwd=cwd, **env)
    rows = []
    for line in p.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| ( *)(\S+)", line)
        if m and not m.group(2):  # top-level imports only, with their cumulative time
            rows.append((int(m.group(1)), m.group(3)))
    return [f"{name} {us / 1e6:.3f} s" for us, name in sorted(rows, reverse=True)[:6]]


def run(quick: bool) -> list[dict]:
    reps = common.reps(5 if quick else 15)
    cwd = common.scratch("cli-")
    env = {"XDG_CONFIG_HOME": str(cwd / "xdg"), "HPCTRAIN_SITE_PATH": ""}
    base = [common.PY, "-c", "import jinja2, yaml, click"]
    dry = [HPCTRAIN, "submit", "--profile", "local", "--nodes", "2", "--gpus", "1", "--name",
           "bench-dry", "--dry-run", "--", "--max-steps", "10"]
    big = [HPCTRAIN, "render", "--profile", LARGE, "--nodes", "4096", "--name", "bench-big",
           "--", "--max-steps", "10"]
    small = [HPCTRAIN, "render", "--profile", LARGE, "--nodes", "2", "--name", "bench-small",
             "--", "--max-steps", "10"]
    rows = []
    try:
        t = {"imports": [], "dry": []}
        for _ in range(reps):
            t["imports"].append(wall(base, cwd, **env))
            t["dry"].append(wall(dry, cwd, **env))
        b, d = common.median(t["imports"]), common.median(t["dry"])
        imports = slowest_imports(["-m", "hpctrain", *dry[1:]], cwd, **env)
        rows.append(common.measured(
            "cli_submit_dry_run_vs_bare_imports", d / b, "<= 1.5", reps=reps, seconds=t,
            slowest_imports=imports,
            summary=f"submit --dry-run {d:.3f} s; python -c 'import jinja2, yaml, click' {b:.3f} s; "
                    f"slowest imports: {', '.join(imports[:3])}"))
    except common.NotMeasured as e:
        rows.append(common.not_measured("cli_submit_dry_run_vs_bare_imports", "<= 1.5", str(e)))
    try:
        t = {"4096": [], "2": []}
        for _ in range(reps):
            t["4096"].append(wall(big, cwd, **env))
            t["2"].append(wall(small, cwd, **env))
        s4096, s2 = common.median(t["4096"]), common.median(t["2"])
        script = common.run(big, timeout=120, cwd=cwd, **env).stdout
        rows.append(common.measured(
            "cli_render_4096_nodes_seconds", s4096, "< 1.0", reps=reps, seconds=t,
            script_lines=len(script.splitlines()),
            summary=f"`hpctrain render --nodes 4096` (validate + render, process start included) "
                    f"{s4096:.3f} s; 2 nodes {s2:.3f} s"))
    except common.NotMeasured as e:
        rows.append(common.not_measured("cli_render_4096_nodes_seconds", "< 1.0", str(e)))
    return rows

"""The layers keep their jobs: the CLI only parses and prints (no file written, no process started
by hpctrain/cli itself), submitit's private API is used in one module and matches the installed
version, and every scheduler in the registry implements the protocol."""

from __future__ import annotations

import ast
import importlib
import inspect
from importlib.metadata import version
from pathlib import Path

from hpctrain import dispatch
from hpctrain.dispatch import submitit_api

REPO = Path(__file__).resolve().parent.parent
CLI = REPO / "hpctrain" / "cli"
# Calls that write files, start or signal processes: the service layer's job, never the CLI's.
FORBIDDEN_CALLS = {
    "open",
    "write_text",
    "write_bytes",
    "mkdir",
    "makedirs",
    "unlink",
    "rmtree",
    "rename",
    "chmod",
    "fchmod",
    "fsync",
    "mkstemp",
    "mkdtemp",
    "symlink_to",
    "touch",
    "copyfile",
    "copytree",
    "Popen",
    "call",
    "check_call",
    "check_output",
    "system",
    "kill",
    "killpg",
    "execv",
    "fork",
}
FORBIDDEN_ATTRS = {("os", "replace"), ("subprocess", "run"), ("shutil", "move"), ("shutil", "copy")}
FORBIDDEN_MODULES = {"subprocess", "tempfile", "signal"}


def test_the_cli_writes_no_file_and_starts_no_process() -> None:
    found = []
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                for name in names:
                    if name.split(".")[0] in FORBIDDEN_MODULES:
                        found.append(f"{path.name}:{node.lineno}: imports {name}")
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
                if name in FORBIDDEN_CALLS or (owner, name) in FORBIDDEN_ATTRS:
                    found.append(f"{path.name}:{node.lineno}: calls {name}()")
    assert not found, (
        "hpctrain/cli only parses and prints; move these into hpctrain/service/:\n"
        + "\n".join(found)
    )


def test_submitit_private_api_still_matches() -> None:
    installed = version("submitit")
    lo, hi = (s.lstrip("<>=") for s in submitit_api.SUPPORTED)
    as_tuple = lambda v: tuple(int(x) for x in v.split(".")[:3])  # noqa: E731
    assert as_tuple(lo) <= as_tuple(installed) < as_tuple(hi), (
        f"submitit {installed} is outside the range hpctrain supports {submitit_api.SUPPORTED}: "
        "hpctrain/dispatch/submitit_api.py uses private parts of submitit; check them against the "
        "new version, then widen SUPPORTED and pyproject.toml together"
    )
    problems = submitit_api.check_private_api()
    assert not problems, (
        "submitit changed what hpctrain/dispatch/submitit_api.py relies on:\n  "
        + "\n  ".join(problems)
    )
    pinned = (REPO / "pyproject.toml").read_text()
    assert f'"submitit{submitit_api.SUPPORTED[0]},{submitit_api.SUPPORTED[1]}"' in pinned


def test_submitit_private_names_appear_only_in_its_bridge() -> None:
    private = (
        "_submit_command",
        "_make_submission_file_text",
        "_make_submission_command",
        "_make_command",
        "read_info(",
    )
    offenders = [
        f"{p.relative_to(REPO)}: {name}"
        for p in sorted((REPO / "hpctrain").rglob("*.py"))
        if p.name != "submitit_api.py"
        for name in private
        if name in p.read_text()
    ]
    assert not offenders, "submitit's private API outside dispatch/submitit_api.py:\n" + "\n".join(
        offenders
    )


def test_every_registered_scheduler_implements_the_protocol() -> None:
    wanted = {
        n: inspect.signature(getattr(dispatch.Scheduler, n))
        for n in ("submit", "state", "cancel", "signal")
    }
    for name, module in dispatch.SCHEDULERS.items():
        impl = importlib.import_module(module).SCHEDULER
        for method, sig in wanted.items():
            got = inspect.signature(getattr(type(impl), method))
            assert list(got.parameters) == list(sig.parameters), f"{name}.{method}{got} != {sig}"


# Files opened for writing by hand outside hpctrain/kernel/, each for a reason: none is a run-folder
# file written outside RunFolder (write / append / open_log / event) or kernel/files.py.
HAND_WRITES_ALLOWED = {
    # checkpoint step payloads: written into a staging folder, then committed by the kernel format
    "hpctrain/runtime.py",
    "train_entry/checkpoint",
    # py-spy + faulthandler need a real file descriptor; the STALLED marker is an O_EXCL create
    "train_entry/watchdog.py",
    # RunDir itself: copy_aside creates its copy exclusively (open "xb")
    "hpctrain/runs.py",
    # not run folders: the check-resume scratch logs, the remote submit staging copy
    "hpctrain/service/check_resume.py",
    "hpctrain/remote/submit.py",
}


def _hand_writes(tree: ast.AST) -> list[int]:
    """Lines that open a file for writing without the kernel: open(p, "w"/"a"/"x"...),
    p.open("w"...), p.write_text / p.write_bytes, logging.FileHandler."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if name in ("write_text", "write_bytes", "FileHandler"):
            lines.append(node.lineno)
        elif name == "open":
            modes = [a for a in node.args if isinstance(a, ast.Constant)]
            modes += [k.value for k in node.keywords if k.arg == "mode"]
            for m in modes:
                if isinstance(m, ast.Constant) and isinstance(m.value, str):
                    if set(m.value) & set("wax"):
                        lines.append(node.lineno)
    return lines


def test_run_folder_files_are_written_only_through_the_kernel() -> None:
    found = []
    for top in ("hpctrain", "train_entry"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith("hpctrain/kernel/") or any(
                rel == a or rel.startswith(a + "/") for a in HAND_WRITES_ALLOWED
            ):
                continue
            found += [f"{rel}:{n}" for n in _hand_writes(ast.parse(path.read_text()))]
    assert not found, (
        "write run-folder files through hpctrain.kernel.rundir.RunFolder (write, append, "
        f"open_log, event) or hpctrain.kernel.files: {found}"
    )

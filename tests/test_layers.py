"""The layers keep their jobs: the CLI only parses and prints (no file written, no process started
by hpctrain/cli itself), submitit's private API is used in one module and matches the installed
version, and every scheduler in the registry implements the protocol."""

from __future__ import annotations

import ast
import importlib
import inspect
from importlib.metadata import version
from pathlib import Path

import _house

from hpctrain import containers, dispatch, launchers
from hpctrain.dispatch import submitit_api
from hpctrain.kernel import plugins
from hpctrain.kernel import strategies as kernel_strategies

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


def _protocol_methods(proto: type) -> dict[str, list[str]]:
    names = [n for n in vars(proto) if not n.startswith("_")]
    return {n: list(inspect.signature(getattr(proto, n)).parameters)[1:] for n in names}


def test_every_registered_plugin_implements_its_protocol() -> None:
    kinds = (
        (plugins.SCHEDULERS, dispatch.Scheduler, lambda m: type(m.SCHEDULER)),
        (plugins.LAUNCHERS, launchers.Launcher, lambda m: m),
        (plugins.CONTAINERS, containers.ContainerKind, lambda m: m),
    )
    for registry, proto, impl_of in kinds:
        wanted = _protocol_methods(proto)
        assert wanted, proto
        for name, module in registry.items():
            impl = impl_of(importlib.import_module(module))
            for method, params in wanted.items():
                got = list(inspect.signature(getattr(impl, method)).parameters)
                got = got[1:] if isinstance(impl, type) else got
                assert got == params, (
                    f"{name}.{method}({got}) != {proto.__name__}.{method}({params})"
                )


# Files opened for writing by hand outside hpctrain/kernel/, each for a reason: none is a run-folder
# file written outside RunFolder (write / append / open_log / event) or kernel/files.py.
HAND_WRITES_ALLOWED = {
    # checkpoint step payloads: written into a staging folder, then committed by the kernel format
    "hpctrain/runtime",
    "train_entry/checkpoint",
    # py-spy + faulthandler need a real file descriptor; the STALLED marker is an O_EXCL create
    "train_entry/watchdog.py",
    # RunDir itself: copy_aside creates its copy exclusively (open "xb")
    "hpctrain/runs/folder.py",
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


# The folders are the architecture: hpctrain/'s root holds only entry points and faces; the
# rest lives in a room per stage of the flow (docs/design.md, "Layout").
ROOT_MODULES = {"__init__.py", "__main__.py"}  # the user-script API is a package: runtime/


def test_the_package_root_holds_at_most_five_modules() -> None:
    root = sorted(p.name for p in (REPO / "hpctrain").glob("*.py"))
    assert len(root) <= 5, f"hpctrain/ holds {len(root)} modules {root}: move them into a room"
    assert set(root) <= ROOT_MODULES, (
        f"new module(s) at hpctrain/'s root: {sorted(set(root) - ROOT_MODULES)}; put code in the "
        "room it belongs to (docs/design.md, 'Where to add'), or say here why it is a face"
    )


# The CLI builds one typed JobOptions (hpctrain/jobs/options.py) and hands it down; no signature of
# the CLI, the service layer or what they call for a job takes the options as a dict.
TYPED_LAYERS = (
    "hpctrain/cli",
    "hpctrain/service",
    "hpctrain/checks/doctor/service.py",
    "hpctrain/service/sweep.py",
    "hpctrain/remote/submit.py",
)


def test_no_cli_or_service_signature_takes_an_options_dict() -> None:
    found = []
    for where in TYPED_LAYERS:
        top = REPO / where
        for path in sorted(top.rglob("*.py")) if top.is_dir() else [top]:
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    text = ast.unparse(arg.annotation) if arg.annotation else ""
                    # the command's options under any name (run.yaml's frozen data is not options)
                    options = arg.arg in ("o", "opts", "options", "params", "kwargs")
                    if options and text.replace(" ", "") in (
                        "dict[str,Any]",
                        "dict[str,object]",
                        "dict",
                    ):
                        found.append(
                            f"{path.relative_to(REPO)}:{node.lineno}: {node.name}({arg.arg})"
                        )
    assert not found, "take a typed object (e.g. JobOptions), not an options dict:\n" + "\n".join(
        found
    )


# A file a reader can hold in their head: split by job (a module per concern) past this.
MAX_LINES = 450


def test_no_python_file_is_over_450_lines() -> None:
    long = [
        f"{p.relative_to(REPO)}: {n} lines"
        for top in ("hpctrain", "train_entry", "benchmarks", "tests", "examples")
        for p in sorted((REPO / top).rglob("*.py"))
        # not scratch: a bench's runs (benchmarks/.work) hold DeepSpeed's own zero_to_fp32.py
        if not any(part.startswith(".") for part in p.relative_to(REPO).parts)
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert not long, f"split these by job (at most {MAX_LINES} lines a file):\n" + "\n".join(long)


# Imports sit at the top of a module, where a reader (and any tool that draws the structure) sees
# what it depends on; the CLI stays fast by loading each command's module lazily at the click group
# (hpctrain/cli/__init__.py, LazyGroup). At most MAX_LAZY imports stay inside functions in
# hpctrain/, each saying why on its line or the line above: `# lazy: <reason>` (an optional extra,
# torch on a torch-free path, a real cycle, CLI start-up).
MAX_LAZY = 40


def _function_level_imports() -> list[tuple[str, int, bool]]:
    """(file, line, has a `# lazy:` reason) of every import inside a function in hpctrain/."""
    out = []
    for path in sorted((REPO / "hpctrain").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        seen: set[int] = set()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom) and node.lineno not in seen:
                    seen.add(node.lineno)
                    near = lines[node.lineno - 1] + (
                        lines[node.lineno - 2] if node.lineno > 1 else ""
                    )
                    out.append((str(path.relative_to(REPO)), node.lineno, "# lazy:" in near))
    return out


def test_imports_are_at_the_top_but_for_a_few_with_a_reason() -> None:
    found = _function_level_imports()
    bare = [f"{f}:{n}" for f, n, reason in found if not reason]
    assert not bare, (
        "an import inside a function needs its reason on its line or the line above "
        "(`# lazy: ...`), or move it to the top of the module:\n" + "\n".join(bare)
    )
    assert len(found) <= MAX_LAZY, (
        f"{len(found)} imports inside functions in hpctrain/ (at most {MAX_LAZY}): move them to "
        "the top of their module:\n" + "\n".join(f"{f}:{n}" for f, n, _ in found)
    )


# `Any` switches the type checker off for a value. It stays only at a true boundary (YAML, JSON,
# torch objects, a third-party API without types), each saying so on its line or the line above:
# `# Any: <reason>`; anywhere else, a precise type (a TypedDict, Mapping[str, object], a Protocol,
# the TrainConfig section models).
def _any_annotations() -> list[tuple[str, int, bool]]:
    """(file, line, has an `# Any:` reason) of every parameter or variable annotated `Any`."""
    out = []
    for top in ("hpctrain", "train_entry"):
        for path in sorted((REPO / top).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            lines = text.splitlines()
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.arg | ast.AnnAssign):
                    ann = node.annotation
                    if isinstance(ann, ast.Name) and ann.id == "Any":
                        n = ann.lineno
                        near = lines[n - 1] + (lines[n - 2] if n > 1 else "")
                        out.append((str(path.relative_to(REPO)), n, "# Any:" in near))
    return out


def test_any_annotations_say_why() -> None:
    bare = [f"{f}:{n}" for f, n, reason in _any_annotations() if not reason]
    assert not bare, (
        "`: Any` annotations without a reason: give a precise type, or at a true boundary (YAML, "
        "JSON, torch, a third-party API) say why on the line or the line above with "
        "`# Any: <reason>`:\n" + "\n".join(bare)
    )


# Strategy names are spelled in hpctrain/kernel/strategies.py and compared only inside their own
# modules (train_entry/strategies/NAME.py): everyone else asks StrategyInfo's facts.
def _compared_names(tree: ast.AST, names: set[str]) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for side in sides:
                elts = side.elts if isinstance(side, ast.Tuple | ast.Set | ast.List) else [side]
                if any(isinstance(e, ast.Constant) and e.value in names for e in elts):
                    lines.append(node.lineno)
    return lines


def test_strategy_names_are_compared_only_in_their_modules() -> None:
    names = set(kernel_strategies.NAMES)
    found = []
    for top in ("hpctrain", "train_entry"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == "hpctrain/kernel/strategies.py" or rel.startswith("train_entry/strategies/"):
                continue
            found += [f"{rel}:{n}" for n in _compared_names(ast.parse(path.read_text()), names)]
    assert not found, (
        "a strategy name compared outside its module: give hpctrain/kernel/strategies.py's "
        f"StrategyInfo the fact you need and read it there: {found}"
    )


# Job-state names are spelled once, in hpctrain/kernel/states.py.
STATE_NAMES = {"PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}
STATE_NAMES |= {"OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REQUEUED", "UNKNOWN", "LOST", "WAITING"}


def test_job_states_are_spelled_only_in_the_kernel() -> None:
    found = []
    for top in ("hpctrain", "train_entry"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == "hpctrain/kernel/states.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in STATE_NAMES:
                    found.append(f"{rel}:{node.lineno}: {node.value}")
    assert not found, f"use hpctrain.kernel.states: {found}"


def test_every_import_runs_down_a_floor() -> None:
    found = _house.imports()
    assert ("cli", "service") in found and ("train_entry", "kernel") in found  # it reads imports
    bad = _house.upward(found)
    assert not bad, (
        "an import that runs up or sideways between rooms (tests/_house.py FLOORS): move the code "
        "to the room it belongs to, or pass the value down:\n" + "\n".join(bad)
    )

"""What every launcher starts for a user's `--script` or `--module`: the user's code, run as
`python SCRIPT` or `python -m MODULE` would run it, with one difference at the very end.

    python -m hpctrain.launchers.entry SCRIPT [ARGS...]
    python -m hpctrain.launchers.entry -m MODULE [ARGS...]

Why: a process that used torch.distributed with gloo sometimes aborts in C++ static destructors
after Python's own shutdown ("terminate called without an active exception", SIGABRT; torch 2.13,
seen on an unchanged Hugging Face Trainer script after its last save). torchrun reports that rank
as failed and the job would be requeued as if preempted. So when torch was imported, the process
leaves with `os._exit(status)` once Python's shutdown has joined the script's threads and run its
atexit handlers (this module's handler is registered before any other, so it runs last), and
after flushing every file the script left open. train_entry and
`runtime.exit` end the same way.
"""

from __future__ import annotations

import _io
import atexit
import gc
import os
import runpy
import sys

from hpctrain.kernel import fatal, jobenv

USAGE = "usage: python -m hpctrain.launchers.entry SCRIPT [ARGS...] | -m MODULE [ARGS...]"
_status = [0]


def _leave() -> None:
    if "torch" not in sys.modules:
        return  # nothing of torch's to abort: the interpreter's own exit is the safest
    gc.collect()
    # what the interpreter's teardown would flush: every open file object (the C base class: the
    # ABC check of io.IOBase costs 7x and trips torch's deprecated-name warnings)
    for obj in gc.get_objects():
        if issubclass(type(obj), _io._IOBase) and not obj.closed:  # type(): no __class__ lookup
            try:
                obj.flush()
            except (OSError, ValueError):
                pass  # a broken pipe or a read-only stream: nothing to write
    os._exit(_status[0])


def _code(e: SystemExit) -> int:
    """The exit status Python gives `sys.exit(e.code)`."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def run(argv: list[str]) -> int:
    """Run the script or module as Python would; its exit status."""
    if not argv or argv[0] in ("-h", "--help") or argv[:1] == ["-m"] and len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file in argv[0]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(argv[0])
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(script)  # as `python SCRIPT` sets it (ours: the cwd)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        return _code(e)
    except BaseException as e:
        _report(e)
        if isinstance(e, KeyboardInterrupt):
            return 130
        _fatal(e)
        return 1
    return 0


def _in_job() -> str | None:
    """The run folder when started by hpctrain's batch script (which removes FATAL at each start)."""
    return jobenv.get(jobenv.RUN_DIR) if jobenv.get(jobenv.JOB_ID) else None


def _fatal(e: BaseException) -> None:
    """An exception of the script's own (not a lost peer): FATAL, so no in-job restart repeats it."""
    run_dir = _in_job()
    if run_dir and not fatal.lost_peer(e):
        fatal.write(run_dir, fatal.cause(e, os.environ.get("RANK", "?")))


def _report(e: BaseException) -> None:
    """The traceback Python would print, without this module's and runpy's frames."""
    ours = (run.__code__.co_filename, runpy.__file__, "<frozen runpy>")
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    sys.excepthook(type(e), e.with_traceback(tb), tb)


def main() -> None:
    atexit.register(_leave)  # first, so it runs after every handler the user's code registers
    run_dir = _in_job()
    refused = fatal.refused_start(run_dir) if run_dir else None
    if refused is not None:  # an error that repeats, or a stop already asked: leave at once
        print(refused[1], file=sys.stderr)
        sys.exit(refused[0])
    _status[0] = run(sys.argv[1:])
    fatal.left_preempted(_status[0])  # a script that left 75 by sys.exit, not runtime.exit
    sys.exit(_status[0])


if __name__ == "__main__":
    main()

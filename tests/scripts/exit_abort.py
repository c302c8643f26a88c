"""A user script that ends the way a torch 2.13 + gloo worker sometimes does: its work is done
(a file written and left open, an atexit handler), then the process aborts in C's exit() after
Python's shutdown (`__cxa_atexit(abort)` stands in for torch's C++ static destructors).

    python exit_abort.py OUT [EXIT_CODE]
"""

import atexit
import ctypes
import sys

import torch  # noqa: F401  # the wrapper's os._exit applies to processes that imported torch

out = open(sys.argv[1], "w")  # noqa: SIM115  # left open on purpose: the exit must flush it
out.write(f"argv {sys.argv[1:]} path0 {sys.path[0]} name {__name__}\n")
atexit.register(lambda: open(sys.argv[1] + ".atexit", "w").write("ran\n"))
libc = ctypes.CDLL(None)
libc.__cxa_atexit(libc.abort, None, None)  # as C++ registers a static destructor
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)

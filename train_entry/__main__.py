"""`python -m train_entry --help`; see train_entry/cli.py."""

import sys

from hpctrain.kernel import fatal
from train_entry.cli import main

code = main()
fatal.left_preempted(code)
if "torch.distributed" in sys.modules:  # a process group existed: see dist.exit_now for why
    from train_entry.dist import exit_now

    exit_now(code)
sys.exit(code)

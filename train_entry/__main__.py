"""`python -m train_entry --help`; see train_entry/cli.py."""

import sys

from train_entry.cli import main

sys.exit(main())

"""The kernel: what both sides (the `hpctrain` CLI and `train_entry` on the nodes) agree on.

No click, no torch, no pydantic, no jinja2 here: a training rank imports this package, and so does
the CLI before it has decided whether it needs anything heavy. Each module is one contract:

  errors.py      exceptions that carry an exit code (the CLI turns them into click's in one place)
  exitcodes.py   the exit codes every process of a run agrees on (75: preempted)
  jobenv.py      the job environment: every variable of our prefix, its meaning, who sets it
  layout.py      the run folder's file names
  checkpoint.py  the checkpoint folder format: step folders, MANIFEST.json, verify, `latest`
  strategies.py  the strategy names (the only list of them)
  mesh.py        the parallel layout (pp x dp x tp on one device mesh) and its one validation
  values.py      @frozen / @mutable: dataclasses at a fraction of @dataclass's start-up cost
"""

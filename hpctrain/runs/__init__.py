"""Run folders on disk, and what reads them: a run's life after it is queued.

folder.py    RunDir: one run folder per run name (kernel RunFolder + reading), finding runs
record.py    run.yaml and jobs.jsonl as records (RunRecord, Job), each file parsed once
index.py     the run index ($XDG_STATE_HOME/hpctrain/runs.jsonl): `status NAME` from anywhere
sweepdir.py  the sweep folder (sweep.json, NAME/<i>)
chain.py     planning and reading a chain (chain.txt); dispatch/slurm.py submits it
progress.py  what a run is doing, from its folder: training progress, node health
cause.py     why a run failed: the rank that failed first, and how
procs.py     process identity: is this pid still the process we started
"""

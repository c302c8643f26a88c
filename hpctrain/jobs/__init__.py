"""What to run: a job request, before any folder or scheduler.

request.py       JobRequest: what the user asked for (name, topology, time, entry)
entry_check.py   submit-time checks of the entry's arguments (train_entry's config at the world size)
sweep.py         sweeps: a grid of entry arguments, one run folder per point, a job array
sweep_runner.py  `python -m hpctrain.jobs.sweep_runner`: the local profile's stand-in for an array
"""

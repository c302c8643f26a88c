"""What to run: a job request and, from it and the profile, the job's spec, before any folder.

request.py       JobRequest: what the user asked for (name, topology, time, entry), checked
options.py       JobOptions: the command line's options, typed
entry_check.py   submit-time checks of the entry's arguments (train_entry's config at the world size)
spec.py          JobSpec: everything the batch script says, built once (render(spec) writes it)
topology.py      nodes, GPUs, spares, tasks per node, CPUs per task
directives.py    the #SBATCH lines
exports.py       modules, activation, the ordered exports and their guards, per-task variables
envrefs.py       the variables profile values name: export order and the script's hpctrain_need
"""

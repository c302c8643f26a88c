"""Checks of the machines a job runs on, in one room.

doctor/     `hpctrain doctor`: node checks (checks.py, net.py), the report naming each cause and
            fix (report.py), the per-rank worker a doctor job runs (worker.py), and the runners
            the CLI calls (service.py: here for the local profile, as a short job for Slurm)
preflight/  the gate in every job: per-node checks (node.py), the verdict (gate.py), and
            `hpctrain doctor --bisect` (bisect.py)
"""

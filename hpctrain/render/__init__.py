"""Rendering: a JobSpec (hpctrain/jobs/spec.py) becomes the batch script, byte for byte.

script.py      render(spec): the sbatch/local script from templates/sbatch.sh.j2 and its parts
templating.py  the Jinja sandbox the script is rendered in (plain data, bounded, trusted files)
"""

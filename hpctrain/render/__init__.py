"""Rendering: a profile and a request become the batch script, byte for byte.

script.py          render(): the sbatch/local script from templates/sbatch.sh.j2, #SBATCH directives
launch_context.py  the site-specific part of the render context (launcher + container blocks)
templating.py      the Jinja sandbox the script is rendered in (plain data, bounded, trusted files)
shellwords.py      shell-safe words for the rendered text (quoting, $VAR references)
"""

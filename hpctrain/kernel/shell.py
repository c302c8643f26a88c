"""Shell words and the profile value grammar: one place that decides what a value may hold and how
it is quoted into the rendered script.

`Sh` marks text already safe to paste; every helper returns one. A profile value's `$NAME`,
`${NAME}` and `${NAME:-default}` expand on the node, every other character is literal. The schema
(hpctrain/profiles/schema/checks.py) validates with these patterns; the renderer, the launchers and
the container kinds quote with these helpers.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

# What an #SBATCH value may carry: sbatch reads these lines itself (the shell never sees them), so
# `&`, `|`, `!` and brackets (a constraint such as `a100&ib`) are fine; whitespace, quotes,
# backslashes, `$` (nothing would expand it), `;`, `<`, `>` and control characters are not.
DIRECTIVE_VALUE = r"[^\s'\"\\`$;<>]*"
DIRECTIVE = re.compile(rf"^--[a-z][a-z0-9-]*(={DIRECTIVE_VALUE})?\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# The environment value grammar: these expand on the node, nothing else does. A default is plain
# text: inside the double-quoted `${NAME:-...}` bash still parses quotes, `<(`, `$` and backslashes
# (a `'` there swallows every line up to the next one), so only these characters may appear.
DEFAULT_CHARS = "_./:,=+@%~^ -"
_DEFAULT = r"[A-Za-z0-9_./:,=+@%~^ -]*"
ENV_REF = re.compile(rf"\$(?:\{{[A-Za-z_][A-Za-z0-9_]*(?::-{_DEFAULT})?\}}|[A-Za-z_][A-Za-z0-9_]*)")


# Apptainer/Singularity set NAME inside the container from PREFIX + NAME on the host: such a name
# is checked (hpctrain/profiles/schema/) and locked (hpctrain/profiles/locks.py) as NAME itself.
CONTAINER_ENV_PREFIXES = ("APPTAINERENV_", "SINGULARITYENV_")


def inner_name(name: str) -> str:
    """The name a variable sets inside a container (`APPTAINERENV_X` -> `X`), else itself."""
    for p in CONTAINER_ENV_PREFIXES:
        if name.startswith(p) and len(name) > len(p):
            return name[len(p) :]
    return name


class Sh(str):
    """Text that is already safe to put in the script as it is."""


def quote(value: object) -> Sh:
    """A literal word (nothing expands)."""
    return Sh(shlex.quote(str(value)))


def _dq_escape(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def shvalue(value: object) -> Sh:
    """A double-quoted word in which $NAME, ${NAME} and ${NAME:-default} expand on the node (so a
    profile can say LD_LIBRARY_PATH: /opt/x/lib:$LD_LIBRARY_PATH) and nothing else does: no $(...),
    no backticks."""
    text, out, pos = str(value), [], 0
    for m in ENV_REF.finditer(text):
        out.append(_dq_escape(text[pos : m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_dq_escape(text[pos:]))
    return Sh('"' + "".join(out) + '"')


def option(name: str, value: object) -> Sh:
    """`--name="value"` with the value's variables expanding on the node."""
    return Sh(f"{name}={shvalue(value)}")


def words(values: Iterable[object]) -> Sh:
    """Already-safe words (Sh) joined, others quoted literally."""
    return Sh(" ".join(v if isinstance(v, Sh) else shlex.quote(str(v)) for v in values))


def in_single_quotes(value: object) -> Sh:
    """Safe text for the inside of a '...' string (the per-node command is one)."""
    return Sh(str(value).replace("'", "'\\''"))

"""Shell-safe words for the rendered script: one place that decides how a value is quoted.

`Sh` marks text already safe to paste; every helper returns one. Values follow the profile value
grammar (hpctrain/profiles/schema/checks.py): `$NAME`, `${NAME}`, `${NAME:-default}` expand on the
node, every other character is literal.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from hpctrain.profiles.schema.checks import ENV_REF


class Sh(str):
    """Text that is already safe to put in the script as it is."""


def quote(value: Any) -> Sh:  # Any: any YAML scalar or list of a profile
    """A literal word (nothing expands)."""
    return Sh(shlex.quote(str(value)))


def _dq_escape(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def shvalue(value: Any) -> Sh:  # Any: any YAML scalar or list of a profile
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


def option(name: str, value: Any) -> Sh:  # Any: any YAML scalar or list of a profile
    """`--name="value"` with the value's variables expanding on the node."""
    return Sh(f"{name}={shvalue(value)}")


def words(values: Any) -> Sh:  # Any: any YAML scalar or list of a profile
    """Already-safe words (Sh) joined, others quoted literally."""
    return Sh(" ".join(v if isinstance(v, Sh) else shlex.quote(str(v)) for v in values))


def in_single_quotes(value: Any) -> Sh:  # Any: any YAML scalar or list of a profile
    """Safe text for the inside of a '...' string (the per-node command is one)."""
    return Sh(str(value).replace("'", "'\\''"))

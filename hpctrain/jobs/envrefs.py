"""Variables that profile values name, for the batch script: the order of its exports and the
checks that keep a missing variable from killing it.

The script runs under `set -u`, where `$NAME` of an unset variable ends bash at once, before any
state or event is written. So (1) exports are ordered so that a value follows the exports it names
(`MIOPEN_CUSTOM_CACHE_DIR: ${MIOPEN_USER_DB_PATH}` after MIOPEN_USER_DB_PATH), a cycle refused at
render time with its location; (2) every other name a value needs from the node is checked first
by the script's `hpctrain_need KEY NAME...`, which ends the job FAILED with one line naming the key,
the variable and the fix. `${NAME:-default}` needs nothing: it is the way to allow NAME unset.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from hpctrain.kernel.errors import UserError
from hpctrain.kernel.shell import ENV_REF, Sh, quote

_NAME = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(:-)?")
ALWAYS_SET = {"HOME"}  # set for every job (an activate path's `~` is written $HOME)


def names(value: object) -> list[str]:
    """Every variable `value` expands, with or without a default, in order, once each."""
    out: list[str] = []
    for m in ENV_REF.finditer(str(value)):
        name = _NAME.match(m.group(0)).group(1)  # type: ignore[union-attr]
        if name not in out:
            out.append(name)
    return out


def needs(value: object) -> list[str]:
    """The variables `value` expands without a default: unset, each would stop the script."""
    out: list[str] = []
    for m in ENV_REF.finditer(str(value)):
        found = _NAME.match(m.group(0))
        if found and not found.group(2) and found.group(1) not in out:
            out.append(found.group(1))
    return out


def where(origins: Mapping[str, str], key: str) -> str:
    """`file:line: key` (the origin when it is a place in a file; else the key alone)."""
    origin = origins.get(key, "")
    return f"{origin}: {key}" if re.search(r":\d+\Z", origin) else key


def order(
    env: Mapping[str, str], keys: Mapping[str, str], origins: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The exports sorted by name, except that a value comes after every export it names (its own
    name excepted: `PATH: /x:$PATH` extends the node's PATH). `keys`: name -> the profile key that
    set it, for the message when two values name each other."""
    done: dict[str, str] = {}
    path: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        if name in path:
            loop = path[path.index(name) :] + [name]
            first = loop[0]
            chain = " -> ".join(f"${n}" for n in loop[1:])
            raise UserError(
                f"{where(origins, keys.get(first, first))}: the exports name each other in a "
                f"cycle ({first} uses {chain}), so no order can set them; fix: write one of "
                f"the values out (the cycle: {', '.join(keys.get(n, n) for n in loop[:-1])})"
            )
        path.append(name)
        for ref in names(env[name]):
            if ref != name and ref in env:
                visit(ref)
        path.pop()
        done[name] = env[name]

    for name in sorted(env):
        visit(name)
    return list(done.items())


def guard(key: str, value: object, origins: Mapping[str, str], known: Iterable[str] = ()) -> Sh:
    """`hpctrain_need 'file:line: key' NAME...; ` for the names `value` needs that are not in
    `known` (exported before it by the script itself); "" when it needs none."""
    missing = [n for n in needs(value) if n not in set(known) | ALWAYS_SET]
    if not missing:
        return Sh("")
    return Sh(" ".join(["hpctrain_need", quote(where(origins, key)), *missing]) + "; ")

"""What a lock covers: every key path that sets the same thing as the locked key.

A profile's `locked: [network]` promises that no child profile, user config or flag changes how the
ranks talk to each other. Several keys can set the same thing, so a lock on one covers the others
(docs/security.md). The aliases come from the schema's own tables, so a new key with a dedicated
environment variable, or a new network variable prefix, is covered without touching this file:
- every environment mapping (`environment.env`, `network.env`, `environment.task_env`, a new one
  named `env` or `*_env`) exporting NAME sets `environment.env.NAME` (and `network.env.NAME` for a
  network variable); `APPTAINERENV_NAME`/`SINGULARITYENV_NAME` set NAME (inside the container);
- a variable with a dedicated key (schema.DEDICATED_ENV, e.g. NCCL_SOCKET_IFNAME) is that key;
- a network variable (schema.NETWORK_ENV_PREFIXES: NCCL_, FI_, UCX_, ...) is part of `network`;
- a variable the watchdog section exports (schema.WATCHDOG_ENV, e.g. TORCH_NCCL_ASYNC_ERROR_HANDLING)
  is that `watchdog.*` key, so a lock on `watchdog` covers it;
- `scheduler` decides whether any `slurm.*` key applies at all (local drops every #SBATCH line),
  so a lock on anything under `slurm` covers `scheduler`;
- `slurm.srun_args_if_exists` adds srun options as `slurm.srun_args` does, so a lock on that covers it.
Options that undo a key (`--partition` in srun_args) are refused wherever they appear by the
schema's owned-option tables, locked or not; a torchrun option that sets what a section decides
(schema.TORCHRUN_SECTION: `--local-addr` is `rendezvous`'s) is refused while that section is locked
(the profile's own check, schema/profile.py: a list is one value here, its items are not seen).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from hpctrain.kernel.shell import inner_name
from hpctrain.kernel.yamlsafe import Path_, dotted
from hpctrain.profiles import cache, schema


def sets(path: Path_) -> list[str]:
    """The dotted keys whose meaning the value at `path` decides (itself first)."""
    key = dotted(path)
    out = [key]
    # any environment mapping (environment.env, network.env, environment.task_env, ...): NAME
    at = next(
        (
            i
            for i, p in enumerate(path[:-1])
            if isinstance(p, str)
            and (p == "env" or p.endswith("_env"))
            and isinstance(path[i + 1], str)
        ),
        None,
    )
    if at is not None:
        name = inner_name(str(path[at + 1]))  # APPTAINERENV_X sets X inside the container
        dedicated, prefixes, watchdog = _tables()
        out.append(f"environment.env.{name}")
        if name in dedicated:
            out.append(dedicated[name])
        if name in watchdog:
            out.append(watchdog[name])
        if name.startswith(prefixes):
            out += [f"network.env.{name}", "network"]
    if path[:1] == ("scheduler",):
        out.append("slurm")
    if path[:2] == ("slurm", "srun_args_if_exists"):  # the same srun options, some of the time
        out.append("slurm.srun_args")
    return list(dict.fromkeys(out))


_TABLES: tuple[dict[str, str], tuple[str, ...], dict[str, str]] | None = None


def _tables() -> tuple[dict[str, str], tuple[str, ...], dict[str, str]]:
    """The schema's tables, through the profile cache (no pydantic import on a warm start)."""
    global _TABLES
    if _TABLES is None:
        t = cache.memo("lock_tables", {}, _read_tables)
        _TABLES = (dict(t["dedicated"]), tuple(t["prefixes"]), dict(t["watchdog"]))
    return _TABLES


class _Tables(TypedDict):
    dedicated: dict[str, str]  # schema.DEDICATED_ENV
    prefixes: list[str]  # schema.NETWORK_ENV_PREFIXES
    watchdog: dict[str, str]  # schema.WATCHDOG_ENV


def _read_tables(_: Mapping[str, object]) -> _Tables:
    return {
        "dedicated": dict(schema.DEDICATED_ENV),
        "prefixes": list(schema.NETWORK_ENV_PREFIXES),
        "watchdog": dict(schema.WATCHDOG_ENV),
    }


def covers(lock: str, key: str) -> bool:
    """A lock on `lock` covers `key` when one is the other or contains it."""
    return lock == key or key.startswith(lock + ".") or lock.startswith(key + ".")


def covering_lock(locks: dict[str, str], path: Path_) -> str | None:
    """The first lock that covers anything the value at `path` sets, or None."""
    targets = sets(path)
    for lock in locks:
        if any(covers(lock, t) for t in targets):
            return lock
    return None

"""Generate docs/site-profiles.md, and the profile-key shape in docs/design.md, from the schema,
so the docs and the code cannot drift.

python -m hpctrain.profiles.docs > docs/site-profiles.md
python -m hpctrain.profiles.docs --design docs/design.md    # its `profile-keys` section in place
"""

from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from hpctrain.kernel import docs as kernel_docs
from hpctrain.kernel import jobenv
from hpctrain.kernel.files import write_atomic
from hpctrain.kernel.yamlsafe import MAX_BYTES, MAX_DEPTH
from hpctrain.profiles.schema import Profile

GUIDE = f"""\
# Site profiles

<!-- Generated from hpctrain/profiles/schema.py and hpctrain/profiles/docs.py.
     Do not edit by hand; refresh with:
     .venv/bin/python -m hpctrain.profiles.docs > docs/site-profiles.md -->

A site profile is a YAML file that tells hpctrain everything about one cluster: how to ask Slurm
for nodes and GPUs, which network the ranks use, how each node is set up, where run folders live,
and how preemption works. Admins write and publish them; users pick one with `--profile NAME`.

```console
$ hpctrain profiles list                      # what exists, where from, which one wins
$ hpctrain profiles show roce --resolved      # merged values and the origin of each
$ hpctrain profiles validate mycluster.yaml   # exit 0, or exit 2 with every problem
$ hpctrain profiles publish mycluster.yaml --to /etc/hpctrain/profiles
```

Shipped profiles (`site_configs/`): `local` (this machine, no Slurm), `generic-ib` (InfiniBand),
`roce` (RoCE v2, extends generic-ib), `aws-efa` (EFA with a pyxis container), `ethernet`
(TCP only) and `loopback` (the live two-node test cluster of `tests/slurm/cluster.sh`).
`site_configs/examples/` holds profiles of real clusters modelled on their public documentation
(LUMI, Perlmutter, CSCS Alps, Olivia, JUWELS Booster, Vega, AWS ParallelCluster, Azure NDv5, C3SE
Alvis, CSC Roihu, NCSA Delta, FASRC Cannon, SURF Snellius, PDC Dardel), each citing its pages; they
ship with hpctrain and are found as `example:NAME` (`--profile example:c3se-alvis`,
`extends: example:c3se-alvis`); [publishing-a-site.md](publishing-a-site.md) goes from a site's
sbatch recipe to a published, locked profile.

## Layers

A resolved profile is built from layers, lowest first:

1. the defaults listed below (the schema's own defaults);
2. the `extends` chain, root ancestor first: `extends: NAME` finds a profile by discovery,
   `extends: ./base.yaml` is a path relative to the file. Cycles are rejected, naming the chain.
   A profile that extends a profile of its own name gets the next one down the search order
   (a user's `generic-ib.yaml` may extend the site's `generic-ib`);
3. the user's config, `$XDG_CONFIG_HOME/hpctrain/config.yaml` (default `~/.config`):

   ```yaml
   default_profile: generic-ib     # used when --profile is not given
   overrides:                      # any profile keys
     environment:
       activate: $HOME/venvs/mine
   ```
4. command-line flags (dotted keys such as `slurm.qos`).

Mappings merge key by key (so `network.env` and `environment.env` add up); lists and plain values
replace; `null` resets a key to its default. Every resolved value remembers its origin:
`file:line`, `default`, `user config FILE:line` or `flag KEY` (`hpctrain profiles show NAME
--resolved`).

Without `--profile`: the user config's `default_profile`, else `local` when `sbatch` is not on
PATH, else an error listing the available names.

## Locked keys

`locked: [slurm.account, slurm.partition]` fixes those keys (a whole section may be locked, e.g.
`network`). Locks accumulate down the chain and bind every later layer: a profile that extends
this one, the user config and command-line flags. Changing a locked key is an error naming the key
and the profile file that locked it; writing the same value again is allowed. `name`, `extends`
and `locked` cannot be set from the user config or flags.

## Discovery

Profiles are found by file name (`NAME.yaml` or `NAME.yml`, whose `name:` must match) in, lowest
precedence first:

1. the profiles bundled with hpctrain, and the bundled examples (`site_configs/examples/`) under
   the names `example:NAME`, which never clash with a plain name;
2. each directory of `${jobenv.SITE_PATH}` (colon-separated; where admins publish);
3. `$XDG_CONFIG_HOME/hpctrain/profiles/`.

A later directory wins a name clash; `hpctrain profiles list` shows every file and which one wins.
`--profile` also takes a file path.

## Trust

Profiles decide what runs on the cluster, so, as ssh does with `authorized_keys`, hpctrain refuses
a profile file, or the directory holding it, that is group- or world-writable or owned by someone
other than you or root. Bundled profiles are trusted as much as hpctrain's own code: a bundled
file is refused only when it is more writable than the package's code. The message says which
`chmod go-w` fixes it. The same rule applies to the user config.

YAML is read safely: no tag (`!!python/object`, `!foo`, even `!!str`) is accepted, nor anchors
or aliases; files must be UTF-8 text under {MAX_BYTES // 1024} KiB, a non-empty mapping, at most
{MAX_DEPTH} levels deep, without duplicate keys. Every problem of a file is reported at once as
`file:line: dotted.key: what is wrong; fix: what to write`, with a close-match suggestion for a
misspelt key, and exit code 2.

## Publishing

`hpctrain profiles publish FILE --to DIR` validates FILE (with its chain), then installs it as
`DIR/NAME.yaml`: written to a temporary file in DIR, mode 0644, fsynced, renamed into place (a
reader never sees half a file). DIR is created with mode 0755. A different profile of the same
name is only replaced with `--force`. A profile that extends by path cannot be published (extend
by name). Users see it once DIR is in `${jobenv.SITE_PATH}`.

## Launch, containers and the node environment

- `launch.launcher: torchrun` (default): one srun task per node runs torchrun (or the site's
  wrapper, `launch.torchrun`, with `launch.torchrun_args`), which starts one worker per GPU.
  `launch.launcher: srun`: one srun task per GPU is the worker; each task sets RANK, LOCAL_RANK,
  WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT from Slurm's variables and
  the rendezvous head (torch's env:// init, no torchrun agent). train_entry, user scripts, the
  preemption chain and exact resume work under both. One module per launcher: `hpctrain/launchers/`.
- `environment.container.kind`: `pyxis` (srun `--container-image/-mounts/-workdir/-env`),
  `apptainer` / `singularity` (`BINARY exec|run [--nv|--rocm] --bind ... IMAGE`), `shifter`
  (`#SBATCH --image`, `--module`, `srun shifter --volume=...`), `edf` (`srun --environment=EDF`).
  `$VAR` in images and mounts expands on the node; a mount may be a bare path. One module per kind:
  `hpctrain/containers/`. With a container, `activate` runs inside it, in every task.
- Order on the nodes: the batch shell runs `environment.setup`, then `environment.modules` (each
  through a helper that stops the job, naming the command, when it fails), activation, then exports
  `network.env` and `environment.env`; every task then resolves the gloo interface, detects its
  GPUs (NVIDIA by nvidia-smi; AMD by rocm-smi or /dev/kfd, with ROCR_VISIBLE_DEVICES as the one
  visibility variable), activates inside the container, exports `environment.task_env` and runs
  `environment.task_setup`.
- `environment.setup` and `environment.task_setup` are trusted admin content: shell lines run as
  written. Keep them in site profiles and lock them.
- Environment values everywhere: `$NAME`, `${{NAME}}` and `${{NAME:-default}}` expand on the node,
  every other character is literal, `$(...)`, `$((...))` and backticks are refused. A default is
  plain text (letters, digits, spaces and `_./:,=+@%~^-`: bash parses quotes and other syntax
  inside it), and in a command word (a binary, python, an image) it never starts with `-`. Names may be mixed case
  (`PMIX_MCA_psec`). `NAME: null` in a child profile removes an inherited entry.
- The rendezvous head is the first node of the allocation, resolved with getent; with
  `rendezvous.host_suffix` its name gets a suffix first (`jwb0001i`); with `rendezvous.interface`
  it is that interface's IPv4 on the first node. The port comes from the job id inside
  `port_min`..`port_max`, never 29500 and never in the ephemeral range, unless `rendezvous.port`
  names one (29500 included).
- `template: NAME.j2` picks a template for this profile only (from the site folders' `templates/`).

## Network notes

- `socket_ifname` uses NCCL's syntax: `eth` (prefix), `=eth0` (exact), `ib0,ib1`, `^docker,lo`
  (exclude), `^=docker0` (exclude exactly). `=^...`, empty items and spaces are errors.
- gloo takes exact names only: `gloo_socket_ifname` defaults to `socket_ifname`: an exact name
  (`=eth0`) as it is, a prefix (`hsn`, `bond`, `ib0,ib1`) resolved in every task to the node's
  first interface with that prefix, unset when it excludes (`^`).
- Variables with their own key (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_DISABLE,
  NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_P2P_LEVEL) are refused in `network.env`.
- `preemption.signal: USR1` is accepted, but NCCL and some launchers use USR1 themselves; prefer
  the default USR2.

# Key reference
"""


def _type(annotation: object) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_type(a) for a in args if a is not type(None)]
        return " \\| ".join(parts) + (" \\| null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type(args[0])}"
    if origin is dict:
        return f"mapping NAME: {_type(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.get_default(call_default_factory=True)  # the factory's value
        if isinstance(value, BaseModel):
            return "(section)"
        return f"`{json.dumps(value)}`"
    if field.default is PydanticUndefined:
        return "required"
    return f"`{json.dumps(field.default)}`"


def _rows(
    model: type[BaseModel], prefix: str, sections: list[tuple[str, type[BaseModel]]]
) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{key}` | {_type(field.annotation)} | {_default(field)} | {desc} |")
        inner = [
            a
            for a in (field.annotation, *typing.get_args(field.annotation))
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if inner:
            sections.append((key, inner[0]))
    return rows


def render() -> str:
    """The whole of docs/site-profiles.md."""
    out = [GUIDE]
    queue: list[tuple[str, type[BaseModel]]] = [("", Profile)]
    while queue:
        key, model = queue.pop(0)
        found: list[tuple[str, type[BaseModel]]] = []
        title = f"`{key}`" if key else "Top level"
        doc = (model.__doc__ or "").strip().splitlines()[0]
        out.append(
            f"\n## {title}\n\n{doc}\n\n| key | type | default | meaning |\n|---|---|---|---|"
        )
        out += _rows(model, f"{key}." if key else "", found)
        queue += found
    return "\n".join(out) + "\n"


def _plain(annotation: object) -> str:
    """A field's type as the shape writes it: `str | null`, `a | b`, `[str]`, `{NAME: str}`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _plain(args[0])
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_plain(a) for a in args if a is not type(None)]
        return " | ".join(parts) + (" | null" if type(None) in args else "")
    if origin is list:
        return f"[{_plain(args[0])}]"
    if origin is dict:
        return f"{{NAME: {_plain(args[1])}}}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "{...}"
    return getattr(annotation, "__name__", str(annotation))


def _section(annotation: object) -> type[BaseModel] | None:
    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _shape_lines(model: type[BaseModel], indent: str) -> list[str]:
    lines = []
    for name, field in model.model_fields.items():
        inner = _section(field.annotation)
        if inner is not None:  # a section: its keys below
            head = f"{indent}{name}:"
            optional = field.default_factory is None
            lines.append(f"{head:<44} # default null; when set:" if optional else head)
            lines += _shape_lines(inner, indent + "  ")
            continue
        text = f"{indent}{name}: {_plain(field.annotation)}"
        default = _default(field).strip("`")
        note = "required" if default == "required" else f"default {default}"
        lines.append(f"{text:<44} # {note}" if len(text) < 44 else f"{text}  # {note}")
    return lines


def shape() -> str:
    """docs/design.md's `profile-keys` section: every key of the schema, nested as in a file."""
    return "```yaml\n" + "\n".join(_shape_lines(Profile, "")) + "\n```"


def fill_design(text: str) -> str:
    """docs/design.md with its `profile-keys` section generated from the schema."""
    return kernel_docs.fill(text, {"profile-keys": shape})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--design"] and len(sys.argv) == 3:
        path = Path(sys.argv[2])
        write_atomic(path, fill_design(path.read_text(encoding="utf-8")), durable=False)
    else:
        print(render(), end="")

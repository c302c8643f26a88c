"""Compare two profiles the way an admin reviews a change: the resolved keys that differ (with
where each value comes from) and the unified diff of the scripts both render for the same request.

    from hpctrain.service.diff import compare
    result = compare("mycluster", "./mycluster.yaml", nodes=2)   # published vs the new draft
    print(result.text())

`hpctrain profiles diff OLD NEW` prints it; exit 0 when both render the same script, 1 otherwise.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.profiles.load import resolve
from hpctrain.render.script import render

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

RUN = "/runs/diff"  # a fixed run folder: both scripts differ only where the profiles do


@dataclass
class KeyChange:
    key: str
    old: Any  # Any: parsed YAML of any shape
    new: Any  # Any: parsed YAML of any shape
    old_origin: str
    new_origin: str


@dataclass
class Comparison:
    old: str
    new: str
    keys: list[KeyChange] = field(default_factory=list)
    script_diff: list[str] = field(default_factory=list)

    @property
    def same_script(self) -> bool:
        return not self.script_diff

    def text(self) -> str:
        out = [f"profiles: {self.old} -> {self.new}"]
        if not self.keys:
            out.append("keys: no resolved value differs")
        for k in self.keys:
            out.append(
                f"  {k.key}: {json.dumps(k.old)} ({k.old_origin}) -> {json.dumps(k.new)} "
                f"({k.new_origin})"
            )
        out.append("script: the same" if self.same_script else "script:")
        return "\n".join(out) + "\n" + "".join(self.script_diff)

    def as_json(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "same_script": self.same_script,
            "keys": [k.__dict__ for k in self.keys],
            "script_diff": "".join(self.script_diff),
        }


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:  # Any: parsed YAML of any shape
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def _script(profile: ResolvedProfile, nodes: int, gpus: int | None) -> str:
    req = JobRequest.build(profile, name="diff", nodes=nodes, gpus=gpus, args=[])
    return render(JobSpec.build(profile, req, RUN, python="/node/python"))


def compare(old_ref: str, new_ref: str, *, nodes: int = 2, gpus: int | None = None) -> Comparison:
    """Both profiles resolved through every layer (as `submit` would), then compared."""
    old, new = resolve(old_ref), resolve(new_ref)
    result = Comparison(f"{old.name} ({old.source})", f"{new.name} ({new.source})")
    a, b = _leaves(old.model_dump(mode="json")), _leaves(new.model_dump(mode="json"))
    for key in sorted(set(a) | set(b)):
        if key != "name" and a.get(key) != b.get(key):
            result.keys.append(
                KeyChange(
                    key,
                    a.get(key),
                    b.get(key),
                    old.origins.get(key, "default"),
                    new.origins.get(key, "default"),
                )
            )
    result.script_diff = list(
        difflib.unified_diff(
            _script(old, nodes, gpus).splitlines(keepends=True),
            _script(new, nodes, gpus).splitlines(keepends=True),
            fromfile=f"{old.name}/job.sh",
            tofile=f"{new.name}/job.sh",
        )
    )
    return result

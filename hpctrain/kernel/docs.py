"""The contract tables of docs/design.md, generated from the kernel (a test fails when they drift).

    python -m hpctrain.kernel.docs docs/design.md     # rewrite the generated sections in place

A generated section sits between `<!-- generated: NAME -->` and `<!-- end: NAME -->`; the text
around it is written by hand.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from hpctrain.kernel import exitcodes, jobenv, layout, strategies


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def job_environment() -> str:
    return _table(
        ("variable", "meaning", "set by", "read by"),
        [(f"`{v.name}`", v.meaning, v.set_by, v.read_by) for v in jobenv.VARS],
    )


def run_folder() -> str:
    return _table(
        ("path", "what", "written by"),
        [(f"`{e.path}`", e.meaning, e.written_by) for e in layout.ENTRIES],
    )


def exit_codes() -> str:
    return _table(
        ("code", "meaning"), [(f"`{code}`", text) for code, text in exitcodes.MEANING.items()]
    )


def strategy_names() -> str:
    return _table(
        ("name", "what", "checkpoint", "reshards", "async save", "with tp/pp"),
        [
            (
                f"`{s.name}`",
                s.summary,
                s.checkpoint,
                "yes" if s.reshards else "no",
                "yes" if s.async_save else "no",
                "yes (the dp dimension)" if s.mesh else "no",
            )
            for s in strategies.STRATEGIES.values()
        ],
    )


SECTIONS = {
    "job-environment": job_environment,
    "run-folder": run_folder,
    "exit-codes": exit_codes,
    "strategies": strategy_names,
}
_BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[a-z-]+) -->\n)(?:.*?\n)?(<!-- end: (?P=name) -->)", re.S
)


def fill(text: str, sections: dict[str, Callable[[], str]] | None = None) -> str:
    """`text` with every generated section replaced by what the kernel says now; `sections`
    (default: the kernel's) names the generators, and a section of another generator is left as
    it is (the profile keys: hpctrain/profiles/docs.py, which needs the schema)."""
    gen = SECTIONS if sections is None else sections

    def sub(m: re.Match[str]) -> str:
        if m.group("name") not in gen:
            return m.group(0)
        return m.group(1) + gen[m.group("name")]() + "\n" + m.group(3)

    return _BLOCK.sub(sub, text)


def sections_in(text: str) -> set[str]:
    return {m.group("name") for m in _BLOCK.finditer(text)}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m hpctrain.kernel.docs docs/design.md", file=sys.stderr)
        sys.exit(2)
    path = Path(sys.argv[1])
    path.write_text(fill(path.read_text(encoding="utf-8")), encoding="utf-8")

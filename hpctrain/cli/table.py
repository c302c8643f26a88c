"""A plain-text table for the commands that must start fast (rich alone costs ~35 ms to import
and lay out): one line per row, columns padded to their widest cell, the last one unpadded."""

from __future__ import annotations

from collections.abc import Sequence


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = [list(map(str, headers)), *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    rule = ["-" * w for w in widths]
    out = []
    for r in (cells[0], rule, *cells[1:]):
        out.append(
            "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
        )
    return "\n".join(line.rstrip() for line in out) + "\n"

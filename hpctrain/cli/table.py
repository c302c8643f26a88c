"""Printing text read from run folders: a plain-text table for the commands that must start fast
(rich alone costs ~35 ms to import and lay out), and `printable`, which makes any such text safe to
print on a terminal."""

from __future__ import annotations

import re
from collections.abc import Sequence

# C0 and C1 controls, DEL, and the bidirectional overrides that reorder what a line shows: ESC
# starts terminal sequences (a title, a cleared screen, a hyperlink), so a value from a run folder
# (an event's reason, a log's error line, a host name) never reaches the terminal with one
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c) or (
        f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
    )


def printable(text: object) -> str:
    """`text` as one line with every control character written out (ESC as \\x1b, a newline as
    \\n): for values read from a run folder, each printed as (part of) one line."""
    return _CONTROL.sub(_escape, str(text))


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = [list(map(printable, headers)), *([printable(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    rule = ["-" * w for w in widths]
    out = []
    for r in (cells[0], rule, *cells[1:]):
        out.append(
            "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
        )
    return "\n".join(line.rstrip() for line in out) + "\n"

"""A count as people write it (7000000000, 7e9, 1.3e9, 7B, 350M, 125k, 7_000_000): one parser for
every command that takes one (`plan --params`, `submit/render/sweep --params`)."""

from __future__ import annotations

import math

from hpctrain.kernel.errors import UserError

SCALE = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(value: object, flag: str = "--params") -> int:
    """The count in `value` (an int passes as it is); UserError (one line, exit 2) naming `flag`
    when it is none: inf, nan, 1e400, 0, words."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise UserError(f"{flag} {value}: give a count of at least 1, e.g. 7e9 or 7B")
        return value
    text = str(value).strip().replace("_", "").replace(",", "")
    scale = SCALE.get(text[-1:].lower(), 1)
    try:
        number = float(text[:-1] if scale != 1 else text) * scale
    except ValueError:
        number = 0.0
    if not math.isfinite(number) or round(number) < 1:
        raise UserError(
            f"{flag} {str(value)[:40]!r} is not a parameter count; write e.g. 7000000000, 7e9 or 7B"
        )
    return round(number)

"""Parameter types that more than one command shares (one parser each: `--params` reads the same
in `plan`, `render`, `submit` and `sweep`)."""

from __future__ import annotations

import click

from hpctrain.kernel.counts import parse_count


def flag_of(param: click.Parameter | None) -> str:
    return param.opts[0] if param is not None and param.opts else "the value"


class Count(click.ParamType):  # type: ignore[type-arg]  # click.ParamType[int] fails on click < 8.2
    """A parameter count as people write it: 7000000000, 7e9, 1.3e9, 7B, 350M, 125k."""

    name = "count"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        # one line (UserError), not click's usage block
        return parse_count(value, flag_of(param))

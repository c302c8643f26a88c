"""The Jinja sandbox the batch script is rendered in (docs/security.md, "Templates").

A site template decides what runs on the cluster, so:
- every template loaded, the top one and each `{% include %}` / `{% extends %}` / `{% import %}`,
  passes the same trust check as a profile (owner, group/world write, every folder above it,
  symlink targets), and must resolve inside the `templates/` folder it was found in;
- the context holds plain data only (str, int, float, bool, None, lists, dicts): no Path or model
  objects whose methods (`write_text`, `unlink`, ...) a template could reach;
- the sandbox is immutable and bounded: at most MAX_RANGE items per range(), MAX_SEQ characters or
  items from `*`, `**` and `%`; a recursion, a division by zero or a runaway template is one error
  line naming the template and its line, never a traceback;
- compiled templates are cached only in a folder that is yours and private (0700); anything else
  is not used (a cache is code).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from jinja2 import (
    ChoiceLoader,
    Environment,
    FileSystemBytecodeCache,
    FileSystemLoader,
    PrefixLoader,
    StrictUndefined,
    TemplateError,
    TemplateNotFound,
)
from jinja2.exceptions import SecurityError
from jinja2.loaders import split_template_path
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hpctrain.kernel.errors import UserError
from hpctrain.profiles.trust import check_trust

MAX_RANGE = 10_000
MAX_SEQ = 1_000_000  # characters or items a template may build with one operator
MAX_OUTPUT = 4 * 1024 * 1024
PLAIN = (str, int, float, bool, type(None))


def plain(value: object) -> object:
    """`value` as plain data: models and dataclasses become dicts, paths and other objects text."""
    if isinstance(value, bool | int | float | type(None)):
        return value
    if isinstance(value, str):
        return str(value)  # a str subclass could carry methods: make it plain
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(
        dump
    ):  # a pydantic model; python mode: a cached profile answers it without pydantic
        return plain(dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    return str(value)


def _sized(value: object) -> int:
    return len(value) if isinstance(value, str | list | tuple) else 0


class TrustedLoader(FileSystemLoader):
    """One folder's templates, each passing the trust check before Jinja reads it."""

    def __init__(self, folder: Path, *, bundled: bool) -> None:
        super().__init__(str(folder), followlinks=False)
        self.folder, self.bundled = folder, bundled

    def get_source(
        self, environment: Environment, template: str
    ) -> tuple[str, str, Callable[[], bool]]:
        candidate = self.folder.joinpath(*split_template_path(template))
        if not os.path.lexists(candidate):
            raise TemplateNotFound(template)
        check_trust(
            candidate, what=f"template {candidate}", within=self.folder, bundled=self.bundled
        )
        return super().get_source(environment, template)


class Sandbox(ImmutableSandboxedEnvironment):
    """Immutable, and bounded: `*`, `**`, `%` and `+` cannot build a huge value, no str.format."""

    intercepted_binops = frozenset(["*", "**", "%", "+"])

    def call_binop(self, context: Context, operator: str, left: object, right: object) -> object:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if _sized(seq) and isinstance(n, int) and _sized(seq) * n > MAX_SEQ:
                    raise SecurityError(
                        f"the template builds a text of {_sized(seq) * n} characters "
                        f"(limit {MAX_SEQ})"
                    )
        if operator == "**" and isinstance(left, int | float) and isinstance(right, int | float):
            if abs(left) > 1 and right * math.log2(abs(left)) > 256:
                raise SecurityError(f"{left} ** {right} is too large for a template")
        if operator == "%" and isinstance(left, str):
            _check_widths(left, SecurityError)
        if operator == "+" and _sized(left) + _sized(right) > MAX_SEQ:
            raise SecurityError(f"the template builds a text longer than {MAX_SEQ}")
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: object) -> Callable[..., str] | None:
        if super().wrap_str_format(value) is None:
            return None
        return _refused


def _refused(*args: object, **kwargs: object) -> str:
    raise SecurityError(
        'str.format is not available in templates ("{:999999999}" would '
        "fill the memory); use the `format` filter or ~"
    )


def _bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise SecurityError(f"range of {len(r)} items in a template (limit {MAX_RANGE})")
    return r


def _bounded_format(value: object, *args: object, **kwargs: object) -> str:
    _check_widths(str(value), SecurityError)
    return str(value) % (kwargs or args)


def environment(
    search: list[Path],
    bundled_dir: Path,
    *,
    finalize: Callable[[object], str],
    filters: Mapping[str, Callable[..., str]],
) -> Environment:
    """The sandboxed environment: site folders first (trust-checked), the bundled folder last;
    the bundled folder is also reachable as "hpctrain/<name>", and the bundled template reaches its
    parts only that way (a site folder cannot stand in for one)."""
    base = TrustedLoader(bundled_dir, bundled=True)
    loaders = [TrustedLoader(d, bundled=False) for d in search]
    env = Sandbox(
        loader=ChoiceLoader([PrefixLoader({"hpctrain": base}), *loaders, base]),
        undefined=StrictUndefined,
        finalize=finalize,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        # bash's ${#array[@]} would open a default Jinja comment
        comment_start_string="{##",
        comment_end_string="##}",
        bytecode_cache=_bytecode_cache(),
    )
    env.globals["range"] = _bounded_range
    env.filters.update(filters, format=_bounded_format)
    return env


def _check_widths(fmt: str, error: type[Exception]) -> None:
    if any(int(w) > 10_000 for w in re.findall(r"%[-+ #0]*(\d+)", fmt)):
        raise error("a %-format width above 10000 in a template")


def _bytecode_cache() -> FileSystemBytecodeCache | None:
    """Compiled templates in $XDG_CACHE_HOME/hpctrain/jinja, only if that folder is ours, 0700."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpctrain" / "jinja"
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = base.lstat()
        if (
            not stat.S_ISDIR(st.st_mode)
            or st.st_uid != os.getuid()
            or stat.S_IMODE(st.st_mode) != 0o700
        ):
            return None
        return FileSystemBytecodeCache(str(base))
    except OSError:
        return None


def render_template(env: Environment, name: str, ctx: Mapping[str, object]) -> str:
    """Render with every failure turned into one line: `template FILE:LINE: what; fix`."""
    try:
        template = env.get_template(name)
        text: str = template.render(plain(ctx))
    except UserError:
        raise
    except TemplateError as e:
        raise UserError(f"template {_where(e, name)}: {e}") from None
    except (
        ArithmeticError,
        RecursionError,
        MemoryError,
        TypeError,
        ValueError,
        LookupError,
        AttributeError,
    ) as e:
        what = {RecursionError: "recursion too deep", MemoryError: "out of memory"}.get(type(e))
        raise UserError(
            f"template {_where(e, name)}: {what or type(e).__name__ + ': ' + str(e)}; "
            "fix: correct the site template"
        ) from None
    if len(text) > MAX_OUTPUT:
        raise UserError(
            f"template {name}: the script is {len(text)} bytes (limit {MAX_OUTPUT}); "
            "fix: correct the site template"
        )
    return text


def _where(e: BaseException, name: str) -> str:
    """FILE:LINE of the innermost template frame of an error."""
    file, line = getattr(e, "filename", None), getattr(e, "lineno", None)
    if not (file and line):
        tb = e.__traceback__
        while tb is not None:
            fn = tb.tb_frame.f_code.co_filename
            if not fn.endswith(".py") and not fn.startswith("<"):
                file, line = fn, tb.tb_lineno
            tb = tb.tb_next
    return f"{file or name}:{line or '?'}"

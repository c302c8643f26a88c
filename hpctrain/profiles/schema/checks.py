"""Syntax checks shared by the schema, the renderer and the tests (pure functions, no pydantic).

Each check returns the value or raises ValueError("what is wrong; fix: what to write instead"); the
loader turns that into a `file:line: dotted.key: message` problem. What validates here must render:
the renderer uses the same patterns (DIRECTIVE_VALUE, ENV_REF) instead of its own.
"""

from __future__ import annotations

import re

_IFACE = r"[A-Za-z0-9_.:@-]{1,15}"  # Linux IFNAMSIZ is 16 including NUL
IFACE = re.compile(rf"^{_IFACE}\Z")
_NCCL_IFNAME = re.compile(rf"^\^?=?{_IFACE}(,{_IFACE})*\Z")
_GLOO_IFNAME = re.compile(rf"^{_IFACE}(,{_IFACE})*\Z")
_HCA = r"[A-Za-z0-9_.-]{1,64}(:[0-9]{1,3})?"
_NCCL_IB_HCA = re.compile(rf"^\^?=?{_HCA}(,{_HCA})*\Z")
# What an #SBATCH value may carry: sbatch reads these lines itself (the shell never sees them), so
# `&`, `|`, `!` and brackets (a constraint such as `a100&ib`) are fine; whitespace, quotes,
# backslashes, `$` (nothing would expand it), `;`, `<`, `>` and control characters are not.
DIRECTIVE_VALUE = r"[^\s'\"\\`$;<>]*"
DIRECTIVE = re.compile(rf"^--[a-z][a-z0-9-]*(={DIRECTIVE_VALUE})?\Z")
_OPTION = re.compile(rf"^--([a-z][a-z0-9-]*)(=({DIRECTIVE_VALUE}))?\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# The environment value grammar: these expand on the node, nothing else does.
ENV_REF = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*(?::-[^}$`\"\\]*)?\}|[A-Za-z_][A-Za-z0-9_]*)")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}\Z")
SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:+-]+\Z")
CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:&|\[\]*()!-]+\Z")
MEM = re.compile(r"^[0-9]+[KMGT]?\Z")
MODULE = re.compile(r"^[A-Za-z0-9_.+/@:][A-Za-z0-9_.+/@:-]*\Z")
IMAGE = re.compile(r"^[A-Za-z0-9_.:/#@+=][A-Za-z0-9_.:/#@+=-]*\Z")
WORD = re.compile(r"^[A-Za-z0-9_./+=:@,%-]+\Z")
TEMPLATE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.j2\Z")


def check_nccl_ifname(value: str) -> str:
    """NCCL_SOCKET_IFNAME syntax: `[^][=]name[,name...]` (`^` excludes, `=` matches exactly,
    otherwise each name is a prefix)."""
    if not _NCCL_IFNAME.match(value):
        raise ValueError(
            f"{value!r} is not an NCCL interface expression; fix: write a comma list of interface "
            "names or prefixes with no spaces, optionally starting with ^ (exclude) and/or = "
            "(exact match) in that order, e.g. 'eth', '=eth0', 'ib0,ib1', '^docker,lo', '^=docker0'"
        )
    return value


def check_gloo_ifname(value: str) -> str:
    """GLOO_SOCKET_IFNAME syntax: `name[,name...]` of exact interface names."""
    if not _GLOO_IFNAME.match(value):
        raise ValueError(
            f"{value!r} is not a gloo interface list; fix: gloo takes exact interface names "
            "separated by commas, no ^ or = and no spaces, e.g. 'eth0' or 'lo'"
        )
    return value


def check_ib_hca(value: str) -> str:
    """NCCL_IB_HCA syntax: `[^][=]hca[:port][,hca[:port]...]`."""
    if not _NCCL_IB_HCA.match(value):
        raise ValueError(
            f"{value!r} is not an NCCL_IB_HCA expression; fix: write a comma list of HCA names with "
            "optional :port, optionally starting with ^ and/or =, e.g. 'mlx5_0:1,mlx5_1:1' or '^mlx5_2'"
        )
    return value


def check_option(value: str, owned: dict[str, str], what: str) -> str:
    """One `--key` or `--key=value` option with a safe character set, not one hpctrain owns."""
    m = _OPTION.match(value)
    if not m:
        raise ValueError(
            f"{value!r} is not a safe {what} option; fix: write '--key' or '--key=value' (long form, "
            "lower-case key; value of letters, digits and _.,:/@%+=*~&|![]()#- without spaces, "
            "quotes or $)"
        )
    key = m.group(1)
    if key in owned:
        raise ValueError(f"{value!r}: hpctrain sets --{key} itself; fix: {owned[key]}")
    clash = sorted(k for k in owned if k.startswith(key))
    if clash:
        raise ValueError(
            f"{value!r}: --{key} abbreviates --{clash[0]}, which hpctrain sets itself; "
            "fix: write options in full and leave that one out"
        )
    return value


def check_torchrun_option(value: str, owned: dict[str, str]) -> str:
    """A torchrun option `--key[=value]` (dashes or underscores); the value may use $VAR."""
    m = re.match(r"^--([a-z][a-z0-9_-]*)(=(.*))?\Z", value)
    if not m or (m.group(3) is not None and not WORD.match(ENV_REF.sub("x", m.group(3)) or "x")):
        raise ValueError(
            f"{value!r} is not a safe torchrun option; fix: write '--key' or "
            "'--key=value' (value of letters, digits, _./+=:@,%- and $VAR)"
        )
    key = m.group(1).replace("_", "-")
    if key in owned:
        raise ValueError(f"{value!r}: hpctrain sets --{key} itself; fix: {owned[key]}")
    return value


def check_text(value: str, what: str = "value") -> str:
    """Free text that ends up in a shell script (quoted): no newlines, NUL or control characters."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(
            f"{what} {value!r} contains a newline or control character; "
            "fix: write it on one line without control characters"
        )
    return value


def check_path_text(value: str, what: str) -> str:
    """A path that may use $VAR / ${VAR} (expanded on the node) but no other shell syntax."""
    check_text(value, what)
    rest = ENV_REF.sub("", value)
    if any(c in rest for c in "$`\"'\\;&|<>*?!"):
        raise ValueError(
            f"{what} {value!r} contains shell syntax; fix: use a plain "
            "path, optionally with $VAR, ${VAR} or ${VAR:-default} (expanded on the node)"
        )
    return value


def check_env_value(value: str) -> str:
    """The value grammar: `$NAME`, `${NAME}` and `${NAME:-default}` expand on the node; every other
    character is literal; command substitution is refused (a profile is data, not a program)."""
    if "\x00" in value or "\n" in value or "\r" in value:
        raise ValueError("the value contains a newline or NUL; fix: write it on one line")
    if "`" in value or "$(" in value:
        raise ValueError(
            f"{value!r} uses command substitution ($(...) or backticks), which is not "
            "allowed in a profile value; fix: compute it in the admin `environment."
            "setup` lines, or write the literal value"
        )
    if "$" in ENV_REF.sub("", value):
        raise ValueError(
            f"{value!r} has a $ that is not $NAME, ${{NAME}} or ${{NAME:-default}}; "
            'fix: use one of these forms (a default may not contain } $ ` " or \\)'
        )
    return value


def check_env_name(name: str) -> str:
    if not ENV_NAME.match(name):
        raise ValueError(
            f"{name!r} is not a valid variable name; "
            "fix: use letters, digits and _ (not starting with a digit)"
        )
    return name


def check_word(value: str, what: str) -> str:
    """One word of a command line (a wrapper, a binary): no spaces or quotes; $VAR expands."""
    if not value or not WORD.match(ENV_REF.sub("x", value)) or value.startswith("-"):
        raise ValueError(
            f"{what} {value!r} is not a plain command word; fix: use letters, digits, "
            "_./+=:@,%- and $VAR, not starting with -"
        )
    return value


def check_profile_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{value!r} is not a profile name; fix: use lower-case letters, digits "
            "and _.- (starting with a letter or digit), e.g. 'my-cluster'"
        )
    return value

"""Syntax checks shared by the schema, the renderer and the tests (pure functions, no pydantic).

Each check returns the value or raises ValueError("what is wrong; fix: what to write instead"); the
loader turns that into a `file:line: dotted.key: message` problem. What validates here must render:
the renderer uses the same patterns (hpctrain/kernel/shell.py) instead of its own.
"""

from __future__ import annotations

import re

from hpctrain.kernel.shell import (
    DEFAULT_CHARS,
    DIRECTIVE_VALUE,
    ENV_NAME,
    ENV_REF,
)

_IFACE = r"[A-Za-z0-9_.:@-]{1,15}"  # Linux IFNAMSIZ is 16 including NUL
IFACE = re.compile(rf"^{_IFACE}\Z")
_NCCL_IFNAME = re.compile(rf"^\^?=?{_IFACE}(,{_IFACE})*\Z")
_GLOO_IFNAME = re.compile(rf"^{_IFACE}(,{_IFACE})*\Z")
_HCA = r"[A-Za-z0-9_.-]{1,64}(:[0-9]{1,3})?"
_NCCL_IB_HCA = re.compile(rf"^\^?=?{_HCA}(,{_HCA})*\Z")
_OPTION = re.compile(rf"^--([a-z][a-z0-9-]*)(=({DIRECTIVE_VALUE}))?\Z")
# Any `${NAME:-...}`, to name a default the grammar refuses (up to the first `}`).
_ANY_DEFAULT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)(\}?)")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}\Z")
SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:+-]+\Z")
CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:&|\[\]*()!-]+\Z")
# What Slurm's str_to_mbytes takes: a number, then K, M, G or T in either case, optionally
# followed by B (`480G`, `128GB`, `512000mb`); a bare number is MB, "0" all of the node.
MEM = re.compile(r"^[0-9]+([KMGTkmgt][Bb]?)?\Z")
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
        hint = _spelling(value, owned)
        if hint:
            raise ValueError(f"{value!r}: {hint}")
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


# Slurm's short options (sbatch and srun) and their long forms: a profile writes the long form.
SHORT = {
    "A": "account",
    "B": "extra-node-info",
    "C": "constraint",
    "D": "chdir",
    "E": "preserve-env",
    "G": "gpus",
    "H": "hold",
    "I": "immediate",
    "J": "job-name",
    "K": "kill-on-bad-exit",
    "L": "licenses",
    "M": "clusters",
    "N": "nodes",
    "O": "overcommit",
    "Q": "quiet",
    "S": "core-spec",
    "T": "threads",
    "W": "wait",
    "X": "disable-status",
    "Z": "no-allocate",
    "a": "array",
    "b": "begin",
    "c": "cpus-per-task",
    "d": "dependency",
    "e": "error",
    "i": "input",
    "k": "no-kill",
    "l": "label",
    "m": "distribution",
    "n": "ntasks",
    "o": "output",
    "p": "partition",
    "q": "qos",
    "r": "relative",
    "s": "oversubscribe",
    "t": "time",
    "u": "unbuffered",
    "v": "verbose",
    "w": "nodelist",
    "x": "exclude",
}


def _spelling(value: str, owned: dict[str, str]) -> str | None:
    """For an option in a spelling the list does not take (`-C`, `-ul`, `--cpu_bind=none`), the
    spelling it does take, or the key that sets it; None when it is not that kind of mistake."""
    word, eq, rest = value.partition("=")
    if re.match(r"^-[A-Za-z]+\Z", word):
        longs = [SHORT.get(c) for c in word[1:]]
        if all(longs):
            forms = [f"--{k}" for k in longs if k]
            for k in longs:
                if k in owned:
                    return (
                        f"short option -{word[1:]} is --{k}, which hpctrain sets itself; "
                        f"fix: {owned[k]}"
                    )
            if len(forms) > 1:
                return (
                    f"short options are not accepted; fix: write the long forms, one item "
                    f"each: {', '.join(forms)}"
                )
            return f"short options are not accepted; fix: write the long form {forms[0]}{eq}{rest}"
        return "short options are not accepted; fix: write the option's long form (--key=value)"
    m = re.match(r"^--([A-Za-z][A-Za-z0-9_-]*)\Z", word)
    if m and ("_" in word or word != word.lower()):
        key = m.group(1).replace("_", "-").lower()
        fixed = f"--{key}{eq}{rest}"
        if _OPTION.match(fixed) and key not in owned:
            return f"Slurm spells this option {fixed!r} (dashes, lower case); fix: write {fixed}"
        if key in owned:
            return f"this is --{key}, which hpctrain sets itself; fix: {owned[key]}"
    return None


def check_torchrun_option(value: str, owned: dict[str, str]) -> str:
    """A torchrun option `--key[=value]` (dashes or underscores); the value may use $VAR."""
    check_defaults(value, "torchrun option")
    m = re.match(r"^--([a-z][a-z0-9_-]*)(=(.*))?\Z", value)
    if not m or (m.group(3) is not None and not WORD.match(ENV_REF.sub("x", m.group(3)) or "x")):
        raise ValueError(
            f"{value!r} is not a safe torchrun option; fix: write '--key' or "
            "'--key=value' (value of letters, digits, _./+=:@,%- and $VAR)"
        )
    key = m.group(1).replace("_", "-")
    if key in owned:
        raise ValueError(f"{value!r}: hpctrain sets --{key} itself; fix: {owned[key]}")
    clash = sorted(k for k in owned if k.startswith(key))
    if (
        clash
    ):  # torchrun's argparse expands an unambiguous prefix, and ours come first: it would win
        raise ValueError(
            f"{value!r}: torchrun reads --{key} as --{clash[0]}, which hpctrain sets itself; "
            f"fix: {owned[clash[0]]} (write other options in full)"
        )
    return value


def check_defaults(value: str, what: str, *, word: bool = False) -> str:
    """Every `${NAME:-default}` in `value` has a plain default (letters, digits, DEFAULT_CHARS). In
    a command word (`word`) a default may not start with `-`: it would reach the program as an
    option that no option check has seen."""
    for m in _ANY_DEFAULT.finditer(value):
        name, default, closed = m.groups()
        bad = sorted({c for c in default if not _plain(c)})
        if bad or not closed:
            shown = " ".join(repr(c) for c in bad) if bad else "no closing }"
            raise ValueError(
                f"{what} {value!r}: the default of ${{{name}:-...}} has {shown}; quotes and "
                "other shell syntax in a default are parsed by bash even inside the script's "
                "double quotes; fix: a default of letters, digits, spaces and "
                f"{DEFAULT_CHARS.replace(' ', '')} only (set anything else in environment.setup)"
            )
        if word and default.startswith("-"):
            raise ValueError(
                f"{what} {value!r}: the default of ${{{name}:-...}} starts with -, so the "
                "command would take it as an option; fix: a default that names a program or "
                "path (options go in their own keys, where they are checked)"
            )
    return value


def _plain(c: str) -> bool:
    return (c.isascii() and c.isalnum()) or c in DEFAULT_CHARS


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
    check_defaults(value, what)
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
    if "$((" in value or "$[" in value:
        raise ValueError(
            f"{value!r} uses arithmetic expansion ($((...))), which is not allowed in a "
            "profile value (a profile is data, not a program); fix: write the number out, or "
            "compute it in the admin `environment.setup` lines"
        )
    if "`" in value or "$(" in value:
        raise ValueError(
            f"{value!r} uses command substitution ($(...) or backticks), which is not "
            "allowed in a profile value; fix: compute it in the admin `environment."
            "setup` lines, or write the literal value"
        )
    check_defaults(value, "value")
    if "$" in ENV_REF.sub("", value):
        raise ValueError(
            f"{value!r} has a $ that is not $NAME, ${{NAME}} or ${{NAME:-default}}; "
            "fix: use one of these forms"
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
    check_defaults(value, what, word=True)
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

"""Trust: may this file decide what runs on the cluster?

One check for every profile and template hpctrain loads (docs/security.md). A file is trusted when
nobody but its owner or root could have changed what it says, the way ssh treats its keys:
- the file and every folder above it, up to `/`, belong to you or root;
- none of them is group- or world-writable, except a folder with the sticky bit (like /tmp), where
  others cannot rename or replace an entry they do not own;
- when the path runs through a symlink, both the path as written and the file it resolves to pass
  (a symlink in a 0777 folder can be swapped by anyone, even if its target is safe);
- `within`: the resolved file must stay inside that folder (the folder the entry was found in: a
  symlink in templates/ to /etc/passwd is refused even though root owns /etc/passwd).
Files shipped inside the package (bundled) are trusted as much as hpctrain's own code.
"""

from __future__ import annotations

import os
import stat
from functools import cache
from pathlib import Path

from hpctrain.kernel.errors import UserError


class Untrusted(UserError):
    """A file that someone else could have changed."""


def _chain(path: Path) -> list[Path]:
    """`path` and every folder above it, the path as written (not resolved), outermost last."""
    absolute = Path(os.path.abspath(path))
    return [absolute, *absolute.parents]


def _check_one(target: Path, what: str, uid: int) -> None:
    try:
        st = target.lstat()
    except OSError as e:
        raise Untrusted(
            f"cannot check {target} ({e.strerror}), so {what} cannot be trusted; "
            "fix: check the path and its permissions"
        ) from None
    kind = (
        "symlink" if stat.S_ISLNK(st.st_mode) else "folder" if stat.S_ISDIR(st.st_mode) else "file"
    )
    if st.st_uid not in (0, uid):
        raise Untrusted(
            f"Bad owner (uid {st.st_uid}) of {kind} {target}: not you or root. Refusing "
            f"{what}.\n  fix: chown root {target} (or copy the file somewhere of yours)"
        )
    if stat.S_ISLNK(st.st_mode):
        return  # a symlink's own mode means nothing; its folder and its target are checked
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        who = "group" if st.st_mode & stat.S_IWGRP else "world"
        raise Untrusted(
            f"Bad permissions {stat.S_IMODE(st.st_mode):04o} on {kind} {target}: it is "
            f"{who}-writable, so someone else could change what runs on the cluster. "
            f"Refusing {what}.\n"
            f"  fix: chmod go-w {target}"
        )


def check_trust(
    path: Path | str,
    *,
    what: str | None = None,
    within: Path | str | None = None,
    bundled: bool = False,
) -> Path:
    """Raise Untrusted unless `path` is trusted (module docstring); returns the resolved path."""
    path = Path(path)
    what = what or f"profile {path}"
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as e:
        reason = getattr(e, "strerror", None) or "a symlink loop"
        raise Untrusted(f"cannot resolve {path} ({reason}); fix: check the path") from None
    if not real.is_file():
        raise Untrusted(f"{path} is not a regular file; fix: point at a YAML or template file")
    if within is not None:
        root = Path(within).resolve()
        if real != root and root not in real.parents:
            raise Untrusted(
                f"{path} resolves to {real}, outside {root} where it was found, so {what} "
                "cannot be trusted; fix: copy the file into that folder instead of a symlink"
            )
    if bundled:
        _check_bundled(real, what)
        return real
    uid = os.getuid()
    seen: set[Path] = set()
    for p in [*_chain(path), *_chain(real)]:
        if p not in seen:
            seen.add(p)
            _check_one(p, what, uid)
    return real


def _check_bundled(real: Path, what: str) -> None:
    """A bundled file is refused only when it is more writable than the package's own code (a
    checkout made with umask 002 is not refused for that)."""
    mode = real.stat().st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH) & ~_package_mode():
        raise Untrusted(
            f"Bad permissions {stat.S_IMODE(mode):04o} on file {real}: more writable than "
            f"hpctrain's own code. Refusing {what}.\n  fix: chmod go-w {real}"
        )


@cache
def _package_mode() -> int:
    """The mode of hpctrain's own code (its __init__.py), read once: every bundled template and
    profile a command loads compares with it."""
    return Path(__file__).resolve().parent.parent.joinpath("__init__.py").stat().st_mode


def make_private_dirs(path: Path, mode: int = 0o755) -> None:
    """mkdir -p whose new folders get `mode` whatever the umask (umask 000 must not leave 0777)."""
    missing = []
    p = Path(path)
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=mode)
        os.chmod(d, mode)  # mkdir's mode is masked by the umask only downwards; be exact

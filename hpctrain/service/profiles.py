"""Publishing a site profile: validate it, then install it atomically where users find it."""

from __future__ import annotations

from pathlib import Path

from hpctrain.kernel.errors import UserError
from hpctrain.kernel.files import write_atomic
from hpctrain.profiles.load import resolve_file
from hpctrain.profiles.trust import make_private_dirs


def publish(file: Path, to: Path, *, force: bool = False) -> tuple[str, Path, bool]:
    """Install FILE (validated with its chain) as TO/NAME.yaml, mode 0644, atomically; TO is
    created 0755. (profile name, target, changed): changed False when the same bytes were there."""
    profile = resolve_file(file, user_config=False)
    if profile.extends is not None and (
        "/" in profile.extends or profile.extends.endswith((".yaml", ".yml"))
    ):
        raise UserError(
            f"{file}: extends {profile.extends!r} is a path, which would not resolve "
            "from the published copy; fix: extend by profile name"
        )
    text = file.read_bytes()
    target = to / f"{profile.name}.yaml"
    try:
        make_private_dirs(to, 0o755)  # new parents 0755 whatever the umask
        mode = to.stat().st_mode
        if mode & 0o022:
            raise UserError(
                f"{to} is group- or world-writable ({mode & 0o777:04o}), so profiles in it "
                f"would be refused; fix: chmod go-w {to}"
            )
        if target.is_dir() and not target.is_symlink():
            raise UserError(f"{target} is a folder; fix: move it away, then publish again")
        if target.exists():
            if target.read_bytes() == text:
                return profile.name, target, False
            if not force:
                raise UserError(
                    f"{target} already holds a different profile {profile.name!r}; fix: "
                    "pass --force to replace it, or rename the profile"
                )
        write_atomic(target, text, mode=0o644)
    except OSError as e:
        raise UserError(
            f"cannot publish into {to}: {e.strerror or e} ({e.filename or to}); fix: choose "
            "a folder you can write (and that is not a file)"
        ) from None
    return profile.name, target, True

"""The `login` section: reach the site over SSH from another machine (docs/remote.md)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from hpctrain.profiles.schema.base import Strict
from hpctrain.profiles.schema.checks import check_path_text


class Login(Strict):
    """A login node reached over SSH: `submit`, `status`, `logs`... then work from this machine."""

    host: str = Field(
        description="SSH destination `user@host` or `host` (an alias of ~/.ssh/config "
        "works too); its host key must already be in known_hosts."
    )
    port: int | None = Field(
        None, ge=1, le=65535, description="SSH port; null: ssh's default (22 or ~/.ssh/config)."
    )
    identity: str | None = Field(
        None, description="Private key file (`ssh -i`); null: ssh's default keys or agent."
    )
    remote_python: str = Field(
        "python3",
        description="The site's Python that has hpctrain installed "
        "(e.g. `$HOME/venv/bin/python`; expanded on the "
        "login node).",
    )
    workdir: str = Field(
        "~/.hpctrain",
        description="Folder on the login node for code being "
        "uploaded before its run folder exists.",
    )
    known_hosts: str | None = Field(
        None,
        description="A known_hosts file with the site's host key "
        "(e.g. published with the profile); null: "
        "~/.ssh/known_hosts. Checking is always strict.",
    )
    agent: bool = Field(
        True,
        description="Keep a small hpctrain agent on the login node for this connection and "
        "reach it through a socket forwarded over the control connection: a command costs no "
        "login shell or Python start there. false: every command is one ssh command "
        "(docs/remote.md).",
    )

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        # never starting with `-`: ssh would read `-Jevil@h` as an option, not the destination
        if not re.match(r"^([A-Za-z0-9._][A-Za-z0-9._-]*@)?[A-Za-z0-9][A-Za-z0-9._-]*\Z", v):
            raise ValueError(
                f"login.host {v!r} is not user@host; fix: write host or user@host "
                "(letters, digits, '.', '_', '-'; no spaces, not starting with -)"
            )
        return v

    @field_validator("identity", "remote_python", "workdir", "known_hosts")
    @classmethod
    def _paths(cls, v: str | None) -> str | None:
        return None if v is None else check_path_text(v, "login path")

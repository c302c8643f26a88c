"""The lazy command group (hpctrain/cli/__init__.py): a command module that cannot be imported says
why, never "No such command"; a missing optional extra is one line naming the extra."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from hpctrain.cli import COMMANDS, main


@pytest.fixture
def command(tmp_path, monkeypatch):
    """A command module `broken_cmd` whose body is the given text, registered as `broken`."""

    def make(body: str) -> None:
        (tmp_path / "broken_cmd.py").write_text(
            body + "\nimport click\nbroken = click.Command('b')\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "broken_cmd", raising=False)
        monkeypatch.setitem(COMMANDS, "broken", "broken_cmd:broken")

    return make


def test_a_broken_command_module_surfaces_its_import_error(command):
    command("import hpctrain_no_such_module")
    result = CliRunner().invoke(main, ["broken"])
    assert "No such command" not in result.output
    assert isinstance(result.exception, ModuleNotFoundError), result.output
    assert result.exception.name == "hpctrain_no_such_module"


def test_a_missing_optional_extra_is_one_line_with_the_install(command, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` fails as if absent
    command("import deepspeed")
    result = CliRunner().invoke(main, ["broken"])
    assert result.exit_code == 2 and result.exception is not None
    assert result.output == (
        "Error: `hpctrain broken` needs deepspeed, which is not installed: "
        "pip install 'hpctrain[deepspeed]'\n"
    )


def test_an_unknown_command_is_still_no_such_command():
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2 and "No such command" in result.output

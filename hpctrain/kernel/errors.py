"""Domain errors: plain exceptions that carry an exit code.

The CLI turns them into click's errors in one place (hpctrain/cli/__init__.py); train_entry prints
them itself. Nothing here imports click, so no training rank pulls it in.
"""

from __future__ import annotations

from hpctrain.kernel import exitcodes


class HpctrainError(Exception):
    """A failure to report as one line (no traceback), exiting with `exit_code`."""

    exit_code = exitcodes.FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def format_message(self) -> str:
        return self.message


class UserError(HpctrainError):
    """Bad input from the user or an admin (profile, request, run name). Exit code 2."""

    exit_code = exitcodes.USAGE


class Problem:
    """One validation problem, located in a file: `file:line: key: message (fix)`."""

    __slots__ = ("file", "line", "key", "message")

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.file, self.line, self.key, self.message = file, line, key, message

    def __str__(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f":{self.line}"
        return f"{where}: {self.key + ': ' if self.key else ''}{self.message}"


class ValidationError(UserError):
    """Every problem found at once, one per line."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        n = len(problems)
        head = f"{n} problem{'s' if n != 1 else ''} found:"
        super().__init__("\n".join([head, *(f"  {p}" for p in problems)]))

"""What every `gpurm` command module and the parser share without importing gRPC: the error that ends a command,
the list commands' page size."""

from __future__ import annotations

PAGE_SIZE = 500           # rows a list page asks for (the RM's default; each page is printed as it comes)


class CliError(Exception):
    """Ends the command with one line on stderr and an exit code (2 = bad input or unusable target, 3 = the RM
    could not be reached)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

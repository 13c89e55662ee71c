"""The project's one user-facing exception type.

Anything a user can get wrong (config, dataset, architecture file, flags, a run directory)
raises :class:`AiperfError` with a message they can act on. Only the CLI turns it into an
exit code (``exit_code``, 2 by default); library code never calls ``sys.exit``.
"""


class AiperfError(Exception):
    """A problem the user can fix; ``str(err)`` is a one-line explanation."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code

"""The one exception type of the search package.

Every problem a user can cause (a bad architecture file, an impossible morph request)
surfaces as :class:`NasError` with a message that names the culprit, so callers can turn
it into a one-line error without a traceback.
"""


class NasError(ValueError):
    """An architecture or search request that cannot be honoured; the message says why."""

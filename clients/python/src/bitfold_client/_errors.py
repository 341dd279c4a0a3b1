"""The one exception type of the package."""

from typing import Iterable, Optional

#: The kinds the master answers, as `ErrorKind` in the schema spells them
#: (docs/protocol.md §5).
SERVER_KINDS = (
    "badQuery",
    "notFound",
    "unavailable",
    "internal",
    "tooLarge",
    "forbidden",
    "notLeader",
)

#: The kinds this package adds: no master could be reached or the
#: connection was lost (``connection``); the master failed the call outright
#: (a Cap'n Proto exception, its text the message) or answered what this
#: client cannot read, such as a newer master's error kind (``protocol``);
#: an argument this client cannot send, such as a vid above 2**64 - 1 or a
#: TLS folder missing a file (``badArgument``).
CLIENT_KINDS = ("connection", "protocol", "badArgument")


class Error(Exception):
    """Every failure of a :class:`~bitfold_client.Client` call.

    ``kind`` is the master's error kind as the schema's ``ErrorKind`` names
    it (``"badQuery"``, ``"notFound"``, ``"unavailable"``, ``"internal"``,
    ``"tooLarge"``, ``"forbidden"``, and ``"notLeader"`` from a single
    master only: a client given several goes on to the next) or one of this
    package's: ``"connection"`` (no master answered), ``"protocol"`` (the
    master failed the call outright, or answered what this client cannot
    read) and ``"badArgument"`` (an argument it cannot send). ``message``
    (also ``str(error)``) is the master's text for the master's kinds, and
    says what failed and what to do for the others. ``failed_machines``
    names the machines the master reported failed or down (for
    ``unavailable``), or the masters tried when none leads.
    """

    def __init__(self, kind: str, message: str, failed_machines: Optional[Iterable[str]] = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.failed_machines = list(failed_machines or [])

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"bitfold_client.Error(kind={self.kind!r}, message={self.message!r})"

"""A Python client for bitfold, a distributed bitmap index.

    from bitfold_client import Client

    with Client("127.0.0.1:7100") as client:
        rows = client.query("R:0-9&20", output="positions")

:class:`Client` connects to a master (or the first of several that answers),
runs queries answered as a count, a pyroaring ``BitMap`` or a numpy array of
positions, and imports, clears and deletes vectors. Every failure is an
:class:`Error` whose ``kind`` is the master's error kind. The Cap'n Proto
schema is bundled (:data:`SCHEMA_PATH`); nothing is generated.
"""

from ._client import Client
from ._errors import CLIENT_KINDS, SERVER_KINDS, Error
from ._schema import SCHEMA, SCHEMA_PATH

__version__ = "0.1.0"

__all__ = ["Client", "Error", "SERVER_KINDS", "CLIENT_KINDS", "SCHEMA", "SCHEMA_PATH", "__version__"]

"""The schema bundled with the package: a copy of bitfold's
`schema/bitfold.capnp` (its `scripts/test` checks the copy is current).

It is loaded with a parser of its own: pycapnp's shared parser aborts the
process when two files with the same schema id are loaded, so a program
that also loads bitfold's schema itself with `capnp.load` keeps working.
"""

from pathlib import Path

import capnp

#: Where the bundled schema file is.
SCHEMA_PATH = Path(__file__).with_name("bitfold.capnp")

_PARSER = capnp.SchemaParser()

#: The loaded schema module: `SCHEMA.Master`, `SCHEMA.Result`, ...
SCHEMA = _PARSER.load(str(SCHEMA_PATH))

"""``python -m brooq_py.devdb``: see ``brooq_py.devdb.cli``."""

import sys

from brooq_py.devdb.cli import main

sys.exit(main())

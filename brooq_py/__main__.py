"""``python -m brooq_py``: the command line (see ``brooq_py.cli``)."""

import sys

from brooq_py.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""Entry point for ``python -m rngaudit``."""

from __future__ import annotations

import sys

from rngaudit.cli import main

if __name__ == "__main__":
    sys.exit(main())

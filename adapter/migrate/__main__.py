"""``python -m adapter.migrate report|replay ...`` (adapter/migrate/cli.py)."""

import sys

from .cli import main

sys.exit(main())

"""``python -m bench``: see ``bench.runner`` and docs/performance.md."""

import sys

from .runner import main

sys.exit(main())

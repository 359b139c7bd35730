"""The migration report as a file for ``spark-submit`` (absolute imports, so that it runs as a
script with the ``adapter`` package from ``--py-files adapter.zip`` or an installation)::

    spark-submit --master spark://host:7077 --py-files adapter.zip adapter/migrate/job.py \\
        report DIR --out report.html --json report.json

The same arguments as ``python -m adapter.migrate``; the master is spark-submit's.
"""

import sys

from adapter.migrate.cli import main

if __name__ == "__main__":
    sys.exit(main())

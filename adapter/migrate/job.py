"""The migration report as a file for ``spark-submit`` (absolute imports, so that it runs as a
script with the ``adapter`` package from ``--py-files adapter.zip`` or an installation)::

    spark-submit --master spark://host:7077 --py-files adapter.zip adapter/migrate/job.py \\
        report DIR --out report.html --json report.json

The same arguments as ``python -m adapter.migrate``; the master is spark-submit's.  Python puts
this file's directory first on ``sys.path``, so no module of adapter/migrate may be named like a
standard library module (``html``, ``json`` ...).
"""

import sys

from adapter.migrate.cli import main

if __name__ == "__main__":
    sys.exit(main())

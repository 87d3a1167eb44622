"""``python -m clamor.runtime.worker``: the worker process (what ``clamor-worker`` runs)."""

import sys

from clamor.runtime.worker.process import main

sys.exit(main())

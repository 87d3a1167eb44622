"""How the benchmarks run and record (not a workload itself).

- ``children``: each measured system in its own marked child process, the
  machine's other load, and sweeping what a child leaves behind (re-exported
  here: ``import harness; harness.run_all(...)``);
- ``results``: result rows, ratios, goals, saving under ``bench/results/``;
- ``tables``: the printed table of a result (``markdown``, ``fmt_bytes``, ``find``);
- ``usage``: what a child measures besides seconds: workers' memory, the other load;
- ``options``: the command line ``lookups.py``, ``streaming.py``, ``kmeans.py`` share;
- ``machine``: what every report says about the machine and the commit;
- ``network``: simulated hosts behind shaped links (``--network``).
"""

from harness.children import *
from harness.children import __all__  # noqa: F401

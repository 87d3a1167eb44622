"""One script per measured job; run each with ``python bench/run.py NAME``.

A script too long for one file keeps its task functions (which must be in the child's
``__main__`` to be pickled by value) and imports the rest from parts beside it, named
``<script>_<part>.py`` (``dense_peers.py``, ``kdtree_report.py``, ...): modules with no
``__main__`` of their own, which ``run.py`` does not list as workloads.
"""

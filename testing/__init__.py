"""Helpers shared by the tests and the benchmarks (``clamor.testing``), as ``numpy.testing``.

- :mod:`clamor.testing.netns`: simulated hosts (Linux network namespaces, a bridge,
  rate-limited veth links) for multi-host tests and the benchmarks' network mode.
"""

"""Helpers shared by the tests and the benchmarks (``clamor.testing``), as ``numpy.testing``.

- :mod:`clamor.testing.netns`: simulated hosts (Linux network namespaces, a bridge,
  rate-limited veth links) for multi-host tests and the benchmarks' network mode.
- :mod:`clamor.testing.requirements`: what a test needs from the machine; a missing
  program that ``make test`` installs fails the test, a missing permission skips it.
"""

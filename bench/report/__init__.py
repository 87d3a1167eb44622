"""Writing the benchmarks' reports: ``summary`` (``results/REPORT.md``, every
workload's JSON side by side) and the long reports of the workloads that have one
(``recovery``, ``overhead``, ``paging``: Markdown and figures from a result dict)."""

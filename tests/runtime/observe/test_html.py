"""A cluster and a dataset as a notebook cell's result: an HTML summary built from what
the driver knows (no worker is called), as Dask's Client shows itself."""

from __future__ import annotations

import re

import clamor


def test_a_cluster_and_its_datasets_show_a_summary():
    with clamor.Cluster(workers=2) as cluster:
        text = cluster._repr_html_()
        assert "Clamor cluster" in text and cluster.address in text
        assert "2 live (local)" in text and "budget in all" in text and "0 stages, 0 tasks" in text
        assert "dashboard" not in text  # outside a notebook server's kernel: no link
        ds = cluster.range(10, partitions=4).map(lambda i: i).persist()
        assert ds.count() == 10
        shown = ds._repr_html_()
        assert f"Clamor dataset {ds.id}" in shown and "4 partitions" in shown
        assert "map &lt;- range" in shown and "4 of 4 kept on 2 worker(s)" in shown
        cluster.dashboard_path = "clamor/dashboard/abc"  # what the kernel sets
        assert "clamor/dashboard/abc" in cluster._repr_html_()
        assert re.search(r"Ran</th><td[^>]*>[1-9]\d* stages, [1-9]\d* tasks", cluster._repr_html_())
    assert "(closed)" in cluster._repr_html_()

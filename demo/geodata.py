"""Real places for demos, tests and benchmarks (the paper's geographic workload).

The base set is GeoNames' populated places (CC BY 4.0, credited in
notebooks/data/README.md). The paper queries 7 million OpenStreetMap
locations; `scaled_points` grows the base set to any size by seeded Gaussian
jitter of a few kilometres around each place, and stores the points in
Morton (Z-curve) order so that nearby points sit on nearby pages, as a
spatially bulk-loaded table would.
"""

from __future__ import annotations

import csv
import gzip
import pathlib

import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parent.parent
SHIPPED = _ROOT / "notebooks" / "data" / "geonames-us.csv.gz"
SHARED = _ROOT.parent / "shared" / "data" / "geonames-cities1000.csv"
BAY_AREA = ((36.0, 39.0), (-123.0, -120.0))  # (lat range, lon range), the paper's query region


def load_places(country: str = "US") -> np.ndarray:
    """(n, 2) float64 array of [lat, lon] of the places of `country`."""
    if country == "US" or not SHARED.exists():
        with gzip.open(SHIPPED, "rt", newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        with open(SHARED, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["cc"] == country]
    return np.array([(float(r["lat"]), float(r["lon"])) for r in rows], dtype=np.float64)


def morton_order(points: np.ndarray, bits: int = 16) -> np.ndarray:
    """Indices that sort `points` (n, 2) along a Z-order curve."""
    lo, hi = points.min(axis=0), points.max(axis=0)
    q = ((points - lo) / np.maximum(hi - lo, 1e-12) * ((1 << bits) - 1)).astype(np.uint64)
    code = np.zeros(len(points), dtype=np.uint64)
    for b in range(bits):
        for d in range(2):
            code |= ((q[:, d] >> np.uint64(b)) & np.uint64(1)) << np.uint64(2 * b + d)
    return np.argsort(code, kind="stable")


def scaled_points(n: int, seed: int = 0, km: float = 3.0, country: str = "US") -> np.ndarray:
    """`n` points around real places, in Morton order (float64, shape (n, 2))."""
    places = load_places(country)
    rng = np.random.default_rng(seed)
    # The base set has no populations, so every place is equally likely to be a centre.
    centre = places[rng.integers(0, len(places), size=n)]
    jitter = rng.normal(scale=km / 111.0, size=(n, 2))
    points = centre + jitter
    return np.ascontiguousarray(points[morton_order(points)])


def in_region(points: np.ndarray, region: tuple = BAY_AREA) -> np.ndarray:
    """Boolean mask of the points inside `region` ((lat0, lat1), (lon0, lon1))."""
    (la0, la1), (lo0, lo1) = region
    return (points[:, 0] >= la0) & (points[:, 0] <= la1) & (points[:, 1] >= lo0) & (points[:, 1] <= lo1)

#!/usr/bin/env bash
# The dense workload (issue 29, bench/workloads/dense.py) on the 16-core device machine:
# Python 3.12, no network, an image with numpy, grpcio, protobuf, cloudpickle, psutil and
# fsspec but without Clamor, Ray or Dask. Everything else comes from .whl/ (ignored by
# git; it travels as the run's `carry`):
#
#   *.whl               cp312 / py3 wheels: cffi, pycparser, cryptography; dask,
#                       distributed and their needs; Ray's needs (jsonschema, referencing,
#                       rpds-py, attrs, filelock, msgpack, pyyaml, requests, click, ...)
#   ray-slim.tar.xz     the Ray 2.60.0 cp312 wheel unpacked, without ray/jars, rllib, data,
#                       serve, train, tune, llm and the dashboard's *.map files
#   libssl-dev_*.deb    only if the machine lacks OpenSSL's headers (tls.c needs them)
#   python3.12-include.tar.xz   only if it lacks Python.h
#
# From the repository root on that machine (the device tool's run):
#   bash bench/device/dense_16cores.sh
# It installs the wheels into /tmp/site, builds Clamor in place (pip install -e .), prints
# the machine, and runs `bench/run.py dense --out dense-16cores` from /tmp under a time
# limit; the result (saved after every system, so a stopped run keeps what it measured)
# and the log are copied into $OUT. DENSE_ARGS replaces the workload's arguments,
# DENSE_BUDGET_S (360) its time limit in seconds.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/dense-16cores-out}
BUDGET=${DENSE_BUDGET_S:-360}
# 14 workers first: if the time runs out, the issue's headline case is the one measured.
ARGS=${DENSE_ARGS:---workers 14,2 --repeat 3 --iterations 4 --timeout 150}
NAME=dense-16cores
mkdir -p "$OUT"
exec > >(tee "$OUT/$NAME.log") 2>&1

source "$ROOT/bench/device/setup.sh"

say "bench/run.py dense $ARGS --out $NAME (limit ${BUDGET} s)"
cd /tmp || exit 6
# shellcheck disable=SC2086  # ARGS is a list of arguments
PYTHONUNBUFFERED=1 timeout -s INT -k 90 "$BUDGET" python3 "$ROOT/bench/run.py" dense $ARGS --out "$NAME"
status=$?
say "exit status $status"
cp "$ROOT/bench/results/$NAME.json" "$OUT/" 2>/dev/null || echo "no $NAME.json was written"
exit $status

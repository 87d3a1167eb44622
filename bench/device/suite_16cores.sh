#!/usr/bin/env bash
# Peer workloads on the 16-core device machine (issue 32), each written to its own
# bench/results/<workload>-16cores.json (CLAMOR_BENCH_SUFFIX) and copied into $OUT with
# the log. The wheels and headers come from .whl/ as for dense_16cores.sh (setup.sh).
#
#   bash bench/device/suite_16cores.sh              # the default list below
#   SUITE="overhead:200:--quick|lookups:120:--quick --repeat 3" bash bench/device/suite_16cores.sh
#
# SUITE: "workload:seconds:arguments" items separated by "|", run in order, each under its own time limit (a workload writes its JSON at the
# end: one stopped early leaves none, so the limits must fit). CLAMOR_BENCH_WORKERS
# (default 14) workers per system: two cores stay for the driver and the peers' schedulers.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/suite-16cores-out}
SUITE=${SUITE:-"overhead:140:--passes 1 --repeat 10 --only clamor,dask,ray,limit|lookups:160:--quick --passes 1 --repeat 10|kdtree:110:--quick --passes 1 --repeat 10 --cold 3 --only clamor,dask,ray,limit-sklearn,limit-fork|logreg:90:--quick --passes 1 --repeat 10 --only clamor,ray-ship,ray-actor,dask-ship,limit"}
export CLAMOR_BENCH_WORKERS=${CLAMOR_BENCH_WORKERS:-14}
export CLAMOR_BENCH_SUFFIX=-16cores
mkdir -p "$OUT"
exec > >(tee "$OUT/suite-16cores.log") 2>&1

started=$(mktemp)  # its time stamp marks the results this run writes
source "$ROOT/bench/device/setup.sh"

cd /tmp || exit 6
IFS='|' read -r -a items <<< "$SUITE"
for item in "${items[@]}"; do
    IFS=: read -r name seconds args <<< "$item"
    say "bench/run.py $name $args (limit ${seconds} s, $CLAMOR_BENCH_WORKERS workers)"
    # shellcheck disable=SC2086  # the arguments are a list
    PYTHONUNBUFFERED=1 timeout -s INT -k 20 "$seconds" python3 "$ROOT/bench/run.py" "$name" $args
    say "$name: exit status $?"
    # What this run wrote so far, into $OUT after each workload (a call cut short keeps
    # them; at most 7 files come back with the log). Not git's view: the device's .git
    # can lag the tree it was sent with.
    find "$ROOT/bench/results" -newer "$started" \( -name '*-16cores.json' -o -name '*-16cores.md' \) \
        -exec cp -t "$OUT/" {} +
done
ls -la "$OUT"

#!/usr/bin/env bash
# Peer workloads on the 16-core device machine (issue 32), each written to its own
# bench/results/<workload>-16cores.json (CLAMOR_BENCH_SUFFIX) and copied into $OUT with
# the log. The wheels and headers come from .whl/ as for dense_16cores.sh (setup.sh).
#
#   bash bench/device/suite_16cores.sh              # the default list below
#   SUITE="overhead:--quick lookups:--quick" bash bench/device/suite_16cores.sh
#
# SUITE: "workload:arguments" items (commas in arguments, no spaces: they become spaces),
# run in order, each under its share of SUITE_BUDGET_S (default 480 s) so that what was
# measured comes back even if the time runs out. CLAMOR_BENCH_WORKERS (default 14)
# workers per system: two cores stay for the driver and the peers' schedulers.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/suite-16cores-out}
BUDGET=${SUITE_BUDGET_S:-480}
SUITE=${SUITE:-"overhead:--passes,2 lookups:--quick,--passes,2,--repeat,5 logreg:--quick kdtree:--quick"}
export CLAMOR_BENCH_WORKERS=${CLAMOR_BENCH_WORKERS:-14}
export CLAMOR_BENCH_SUFFIX=-16cores
mkdir -p "$OUT"
exec > >(tee "$OUT/suite-16cores.log") 2>&1

source "$ROOT/bench/device/setup.sh"

cd /tmp || exit 6
read -r -a items <<< "$SUITE"
started=$(date +%s)
for i in "${!items[@]}"; do
    name=${items[$i]%%:*}
    args=${items[$i]#*:}
    [ "$args" = "${items[$i]}" ] && args=""
    left=$(( BUDGET - ($(date +%s) - started) ))
    share=$(( left / (${#items[@]} - i) ))
    if [ "$share" -lt 30 ]; then say "no time left for $name"; continue; fi
    say "bench/run.py $name ${args//,/ } (limit ${share} s, $CLAMOR_BENCH_WORKERS workers)"
    # shellcheck disable=SC2086  # the arguments are a list
    PYTHONUNBUFFERED=1 timeout -s INT -k 30 "$share" python3 "$ROOT/bench/run.py" "$name" ${args//,/ }
    say "$name: exit status $?"
done
cp "$ROOT"/bench/results/*-16cores.json "$ROOT"/bench/results/*-16cores.md "$OUT/" 2>/dev/null
ls -la "$OUT"

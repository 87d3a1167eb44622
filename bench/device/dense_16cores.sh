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
WHL=$ROOT/.whl
SITE=/tmp/site
OUT=${OUT:-/tmp/dense-16cores-out}
BUDGET=${DENSE_BUDGET_S:-360}
# 14 workers first: if the time runs out, the issue's headline case is the one measured.
ARGS=${DENSE_ARGS:---workers 14,2 --repeat 3 --iterations 4 --timeout 150}
NAME=dense-16cores
mkdir -p "$OUT"
exec > >(tee "$OUT/$NAME.log") 2>&1

say() { echo "== $(date +%T) $*"; }

say machine
nproc
uname -r
uname -m
free -g
df -h /dev/shm /tmp
python3 --version
command -v python3 gcc || true
cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null || true

say "wheels into $SITE"
[ -d "$WHL" ] || { echo "no $WHL: name .whl in the run's carry"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHL"/*.whl || exit 3
tar -xJf "$WHL/ray-slim.tar.xz" -C "$SITE" || exit 3
export PYTHONPATH=$SITE

say "build headers"
if ! echo '#include <openssl/ssl.h>' | gcc -E -x c - >/dev/null 2>&1 \
        || ! gcc -lssl -lcrypto -shared -o /tmp/sslcheck.so -x c /dev/null 2>/dev/null; then
    echo "no OpenSSL headers or no libssl.so to link: using $(ls "$WHL"/libssl-dev_*.deb)"
    rm -rf /tmp/ssl-dev && mkdir -p /tmp/ssl-dev/link || exit 4
    dpkg-deb -x "$WHL"/libssl-dev_*.deb /tmp/ssl-dev || exit 4
    for lib in ssl crypto; do  # link against the machine's own runtime libraries
        so=$(ldconfig -p | awk -v l="lib$lib.so.3" '$1 == l && /x86-64/ {print $NF; exit}')
        [ -n "$so" ] || { echo "no lib$lib.so.3 on this machine"; exit 4; }
        ln -sf "$so" "/tmp/ssl-dev/link/lib$lib.so"
    done
    export CPATH=/tmp/ssl-dev/usr/include:/tmp/ssl-dev/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
    export LIBRARY_PATH=/tmp/ssl-dev/link${LIBRARY_PATH:+:$LIBRARY_PATH}
fi
include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
if [ ! -f "$include/Python.h" ]; then
    echo "no $include/Python.h: using python3.12-include.tar.xz"
    mkdir -p /tmp/pyinclude && tar -xJf "$WHL/python3.12-include.tar.xz" -C /tmp/pyinclude || exit 4
    export CPATH=/tmp/pyinclude/python3.12${CPATH:+:$CPATH}
fi

say "build clamor"
(cd "$ROOT" && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .) || exit 5
python3 -c 'import clamor, ray, dask, distributed, numpy
print("clamor", clamor.__file__); print("ray", ray.__version__, "dask", dask.__version__,
      "distributed", distributed.__version__, "numpy", numpy.__version__)' || exit 5

# Ray's object store (twice the table) and the shared-memory row live in /dev/shm.
shm_gib=$(df -BG --output=size /dev/shm | tail -1 | tr -dc 0-9)
if [ "${shm_gib:-0}" -lt 24 ]; then
    say "/dev/shm is ${shm_gib} GiB: remounting it at 48 GiB"
    mount -o remount,size=48G /dev/shm || echo "could not grow /dev/shm (Ray will use /tmp)"
    df -h /dev/shm
fi

say "bench/run.py dense $ARGS --out $NAME (limit ${BUDGET} s)"
cd /tmp || exit 6
# shellcheck disable=SC2086  # ARGS is a list of arguments
PYTHONUNBUFFERED=1 timeout -s INT -k 90 "$BUDGET" python3 "$ROOT/bench/run.py" dense $ARGS --out "$NAME"
status=$?
say "exit status $status"
cp "$ROOT/bench/results/$NAME.json" "$OUT/" 2>/dev/null || echo "no $NAME.json was written"
exit $status

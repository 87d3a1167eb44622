#!/usr/bin/env bash
# Sourced by the 16-core scripts beside it (dense_16cores.sh, suite_16cores.sh): prints
# the machine, installs the wheels carried in $ROOT/.whl into /tmp/site (PYTHONPATH),
# finds OpenSSL's and Python's headers (carried too if the image lacks them), builds
# Clamor in place and grows /dev/shm (once: a second call on the same warm machine
# skips to the workloads). Needs ROOT and OUT; exits on a failed step.
WHL=$ROOT/.whl
SITE=/tmp/site
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

if [ -e "$SITE/.clamor-set-up" ]; then  # a second call on the same (warm) machine
    say "set up already: $SITE"
    export PYTHONPATH=$SITE
    return 0
fi

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

touch "$SITE/.clamor-set-up"

# Ray's object store (twice the table) and the shared-memory row live in /dev/shm.
shm_gib=$(df -BG --output=size /dev/shm | tail -1 | tr -dc 0-9)
if [ "${shm_gib:-0}" -lt 24 ]; then
    say "/dev/shm is ${shm_gib} GiB: remounting it at 48 GiB"
    mount -o remount,size=48G /dev/shm || echo "could not grow /dev/shm (Ray will use /tmp)"
    df -h /dev/shm
fi


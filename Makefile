# The two commands the README opens with: `make demo` and `make test`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
STAMP := .make-installed

.PHONY: install demo test test-fast bench-paging proto clean

$(STAMP): pyproject.toml setup.py runtime/native/*.c runtime/native/*.h runtime/native/build.py
	@command -v gcc >/dev/null && [ -f /usr/include/openssl/hmac.h ] || { \
	  echo "installing gcc and OpenSSL headers (apt-get)"; \
	  apt-get update -qq && apt-get install -y -qq gcc libssl-dev >/dev/null; }
	$(PIP) install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

## Run the main job on the embedded default (local workers): a demand-paged k-d tree demo.
demo: $(STAMP)
	$(PYTHON) notebooks/kdtree_demo.py

## Set up and pass the tests.
test: $(STAMP)
	$(PYTHON) -m pytest -q

test-fast: $(STAMP)
	$(PYTHON) -m pytest -q -m "not slow"

bench-paging: $(STAMP)
	$(PYTHON) bench/paging.py

## Peer systems for bench/overhead.py (Dask distributed, Ray, ipyparallel); benchmarks only.
.PHONY: bench-deps bench-overhead
bench-deps:
	$(PIP) install -q -r bench/requirements.txt

## Per-task and per-stage overhead of empty tasks, Clamor vs. Dask, Ray and ipyparallel.
bench-overhead: $(STAMP) bench-deps
	$(PYTHON) bench/overhead.py

## Recovery from a killed worker and speculation against a straggler (bench/recovery.py).
.PHONY: bench-recovery
bench-recovery: $(STAMP) bench-deps
	$(PYTHON) bench/recovery.py

proto:
	$(PYTHON) runtime/proto/generate.py

clean:
	rm -rf build *.egg-info runtime/native/_native*.so $(STAMP)

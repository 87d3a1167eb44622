# The two commands the README opens with: `make demo` and `make test`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
STAMP := .make-installed

.PHONY: install kernelspec demo lab test test-deps test-oldest test-fast bench-paging proto clean

## The JupyterLab extension (labextension/, TypeScript), prebuilt with JupyterLab's own
## builder into $(LABEXT) and committed, so that `pip install ".[jupyter]"` ships it without
## Node.js (pyproject's data-files put it in {sys.prefix}/share/jupyter/labextensions,
## where JupyterLab finds it enabled). $(LABEXT)/sources.sha256 names the sources it was
## built from; when they change, this rebuilds it: npm ci, tsc, then @jupyterlab/builder
## against the installed JupyterLab's core packages (Node.js from apt-get if missing).
LABEXT := labextension/clamor_labextension
LABEXT_SOURCES = $(shell LC_ALL=C ls labextension/package.json labextension/package-lock.json \
  labextension/tsconfig.json labextension/install.json labextension/src/*.ts labextension/style/* | LC_ALL=C sort)
.PHONY: labextension
labextension:
	@want=$$(cat $(LABEXT_SOURCES) | sha256sum | cut -d' ' -f1); \
	if [ "$$want" != "$$(cat $(LABEXT)/sources.sha256 2>/dev/null)" ]; then \
	  echo "building the JupyterLab extension (its sources changed)"; \
	  command -v npm >/dev/null || { echo "installing Node.js and npm (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }; \
	  $(PYTHON) -c "import jupyterlab" 2>/dev/null || $(PIP) install -q 'jupyterlab>=4.0.2'; \
	  (cd labextension && npm ci --no-audit --no-fund --loglevel=error) || exit 1; \
	  rm -rf $(LABEXT) labextension/lib; \
	  staging=$$($(PYTHON) -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))'); \
	  (cd labextension && JUPYTERLAB_STAGING="$$staging" npm run --silent build) || exit 1; \
	  echo "$$want" > $(LABEXT)/sources.sha256; \
	fi

$(STAMP): pyproject.toml setup.py runtime/paging/native/*.c runtime/paging/native/*.h runtime/paging/native/build.py
	@command -v gcc >/dev/null && [ -f /usr/include/openssl/hmac.h ] || { \
	  echo "installing gcc and OpenSSL headers (apt-get)"; \
	  apt-get update -qq && apt-get install -y -qq gcc libssl-dev >/dev/null; }
	$(PIP) install -q -e '.[test]'
	@touch $(STAMP)

## An editable install copies no data files, so the prebuilt JupyterLab extension is
## copied into this environment (or the user's Jupyter directory) instead
## (labextension/develop.py). Cheap: run every time, so a rebuild is picked up.
install: $(STAMP) labextension
	@$(PYTHON) labextension/develop.py --sys-prefix 2>/dev/null || $(PYTHON) labextension/develop.py --user

## The "Clamor (Python 3)" Jupyter kernelspec, into this environment (or the user's
## Jupyter directory when the environment is not writable). Cheap: run every time.
kernelspec: install
	@$(PYTHON) -m clamor.kernel.cli install-kernel --sys-prefix 2>/dev/null \
	  || $(PYTHON) -m clamor.kernel.cli install-kernel --user

## Run the main job on the embedded default (local workers): the demand-paged k-d tree
## notebook, headless on the Clamor kernel, printing what its cells print.
DEMO_NOTEBOOK ?= notebooks/kdtree.ipynb
demo: kernelspec
	$(PYTHON) -m clamor.kernel.run_notebook $(DEMO_NOTEBOOK)

## JupyterLab on notebooks/ with the Clamor kernel as the default (installs jupyterlab).
LAB_ARGS ?=
lab: kernelspec
	@$(PYTHON) -c "import jupyterlab" 2>/dev/null || $(PIP) install -q jupyterlab
	$(PYTHON) -m jupyterlab --ServerApp.root_dir=notebooks \
	  --MappingKernelManager.default_kernel_name=clamor \
	  $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

## What the suite drives for real besides Python packages: headless Chromium (browser
## tests), iproute2 and OpenSSH (simulated hosts, the SSH launcher), Node.js and
## configurable-http-proxy (JupyterHub). Installed only where missing; apt-get needs root
## (a test that needs root anyway, for network namespaces, skips without it and says so).
test-deps:
	@need=""; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	command -v ip >/dev/null && command -v tc >/dev/null || need="$$need iproute2"; \
	[ -x /usr/sbin/sshd ] || need="$$need openssh-server"; \
	command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || need="$$need openssh-client"; \
	command -v npm >/dev/null || need="$$need nodejs npm"; \
	if [ -n "$$need" ]; then \
	  echo "installing$$need (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need >/dev/null; \
	fi
	@command -v configurable-http-proxy >/dev/null || { \
	  echo "installing configurable-http-proxy (npm)"; \
	  npm install -g --silent configurable-http-proxy >/dev/null; }

## Set up and pass the tests (the kernel and notebook tests need the kernelspec). The whole
## suite runs: a test skips only for what no install step can fix, and -rs prints why.
## Then the fast part again against the oldest versions pyproject.toml allows.
## Test modules run in PYTEST_WORKERS processes (pytest-xdist), a module's tests in one.
PYTEST_WORKERS ?= 2
PYTEST_ARGS = -q -rs -n $(PYTEST_WORKERS) --dist loadfile
test: kernelspec test-deps
	$(PYTHON) -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-oldest

## The fast tests with the oldest dependency versions pyproject.toml allows
## (testing/oldest-versions.txt), in a virtual environment of their own, so the floors
## stay true. Editable like the main install: both use the native module built in place.
OLDEST_VENV ?= .venv-oldest
test-oldest: test-deps labextension
	@[ -x $(OLDEST_VENV)/bin/python ] || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q -c testing/oldest-versions.txt -e '.[test]'
	@$(OLDEST_VENV)/bin/python -m clamor.kernel.cli install-kernel --sys-prefix >/dev/null
	@$(OLDEST_VENV)/bin/python labextension/develop.py --sys-prefix >/dev/null
	$(OLDEST_VENV)/bin/python -m pytest $(PYTEST_ARGS) -m "not slow" -p no:cacheprovider

test-fast: kernelspec
	$(PYTHON) -m pytest $(PYTEST_ARGS) -m "not slow"

bench-paging: $(STAMP)
	$(PYTHON) bench/run.py paging

## Peer systems of the benchmarks (Dask distributed, Ray, ipyparallel, Redis, mpi4py with
## OpenMPI, PySpark with Java); benchmarks only, the tests need none of them.
.PHONY: bench-deps bench-overhead bench bench-quick
bench-deps:
	@command -v redis-server >/dev/null && command -v mpirun >/dev/null && command -v java >/dev/null || { \
	  echo "installing redis-server, OpenMPI and Java (apt-get)"; \
	  apt-get update -qq && apt-get install -y -qq redis-server openmpi-bin libopenmpi-dev \
	    default-jre-headless >/dev/null; }
	$(PIP) install -q -r bench/requirements.txt

## Every workload side by side with its peers, then lookups, streaming, replication and kdtree
## again on simulated hosts behind 1 Gbit/s links (network mode, needs root), then
## bench/results/REPORT.md.
bench: $(STAMP) bench-deps
	$(PYTHON) bench/run.py --network

## A 5-minute subset: the same workloads, scaled down.
bench-quick: $(STAMP) bench-deps
	$(PYTHON) bench/run.py --quick

## Per-task and per-stage overhead of empty tasks, Clamor vs. Dask, Ray and ipyparallel.
bench-overhead: $(STAMP) bench-deps
	$(PYTHON) bench/run.py overhead

## Recovery from a killed worker and speculation against a straggler (bench/workloads/recovery.py).
.PHONY: bench-recovery
bench-recovery: $(STAMP) bench-deps
	$(PYTHON) bench/run.py recovery

## What a live dashboard costs a running stage, in a real kernel (bench/workloads/dashboard.py).
.PHONY: bench-dashboard
bench-dashboard: kernelspec
	$(PYTHON) bench/run.py dashboard

proto:
	$(PYTHON) runtime/net/proto/generate.py

clean:
	rm -rf build *.egg-info runtime/paging/native/_native*.so $(STAMP) $(OLDEST_VENV)
	rm -rf labextension/lib labextension/node_modules  # $(LABEXT) is committed

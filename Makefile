# tierfeed: every command a developer or CI runs. `make demo` and `make test`
# work on a fresh machine: they create .venv, install system packages (fuse3)
# and the project with pinned versions.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP     := $(BIN)/python -m pip
CONSTR  := constraints.txt

.PHONY: demo test test-fast lint format bench bench-all bench-env sysdeps emulators clean

$(STAMP): pyproject.toml $(CONSTR)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -c $(CONSTR) -e '.[dev]'
	touch $(STAMP)

# fuse3 (fusermount3 + libfuse3) is needed by slowfs and mount; we are root here.
sysdeps:
	@command -v fusermount3 >/dev/null 2>&1 && ldconfig -p | grep -q libfuse3 || \
	  { if [ "$$(id -u)" = 0 ]; then \
	      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 libfuse3-3 >/dev/null; \
	    else echo "tierfeed: install fuse3 (apt-get install fuse3) for the FUSE features"; fi; }

# Azurite (Microsoft's Azure Storage emulator) for the az:// tests, from the npm registry; the
# S3 (moto) and GCS emulators come with the Python dev dependencies.
AZURITE := .cache/azurite/node_modules/.bin/azurite-blob
$(AZURITE):
	@command -v npm >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
	npm install --prefix .cache/azurite --no-audit --no-fund --loglevel=error azurite@3.37.0
	test -x $(AZURITE)

emulators: $(AZURITE)

demo: sysdeps $(STAMP)
	$(BIN)/python -m tierfeed.demo

test: sysdeps $(STAMP) $(AZURITE)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not dist and not fuse"

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

# The side-by-side benchmark runs every system, tierfeed included, in an environment of its own:
# the peers as their users install them, beside the torch/torchvision pair that imports here
# (a CUDA build, ~6 GB, from local disk in about a minute).
BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_PIP   := $(BENCH_VENV)/bin/python -m pip install -q --disable-pip-version-check -c bench/peers/constraints.txt

$(BENCH_STAMP): pyproject.toml bench/peers/constraints.txt
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_PIP) torch==2.14.1 torchvision==0.29.1 mosaicml-streaming litdata webdataset s3torchconnector
	$(BENCH_PIP) -e '.[fuse,image,report,fsspec]' 'moto[server,s3]'
	touch $(BENCH_STAMP)

bench-env: $(BENCH_STAMP)

# `make bench`: the side-by-side comparison (docs/BENCHMARKS.md), well under 15 minutes on 2 cores.
bench: sysdeps $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/compare.py

# `make bench-all`: also every component benchmark (format, plans, tiers, mount, guard, dist).
bench-all: bench $(STAMP)
	$(PIP) install -q --disable-pip-version-check -c $(CONSTR) -e '.[dev,bench]'
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) .cache demo-data bench-out .pytest_cache .mypy_cache .ruff_cache

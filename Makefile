# The README's two commands: `make run` (install, prepare the demo, open the dashboard)
# and `make test` (install, start what the tests need, run the whole suite).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DB ?= data/specdec.duckdb
PORT ?= 8501
# torch first, pinned: a bare `torch` requirement pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# Where the environment says PYTHONDONTWRITEBYTECODE (this machine's image does), every Python process the
# suite starts (workers, Streamlit servers, CLIs) compiled each module it imported anew: about 60 s of the
# suite's CPU (a fresh clone's whole run: 458 s before, 428 s after). The suite and the dashboard keep compiled
# modules in the virtual environment's own folder instead, outside the source tree, once.
BYTECODE = env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache

.PHONY: run test install system-deps lint demo-db models bench clean screenshots cli-docs durations

install: $(STAMP)

# The interpreter the environment is made from (BASE_PYTHON=... chooses another): the system's Python 3 where
# it has one (3.10 or later, with venv's ensurepip), else, or where it fails to make one, the first python3 on
# the PATH. A distribution builds its Python with profile-guided and link-time optimisation; pyenv's default
# build (this machine's python3) has neither: pure-Python work runs 25-30% faster on Debian's, and the
# interpreter is a quarter of the suite's CPU (docs/benchmarks.md, session 30).
BASE_PYTHON ?= $(or $(shell for p in /usr/bin/python3 python3; do $$p -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 10))' 2>/dev/null && { echo $$p; break; }; done),python3)

# DuckDB 2.0.1 goes beside the project, only to read stores an older specdec wrote (store/convert.py).
# uv installs the same pins in seconds (a fresh install: 11 s against pip's 71 s); pip does it where uv
# can't be had. uv reads no pip.conf: the wheel folders pip is told of (find-links) are passed on.
FIND_LINKS = $(sort $(PIP_FIND_LINKS) $(shell python3 -m pip config get global.find-links 2>/dev/null))
UV_PIP = $(VENV)/bin/uv pip install -q --python $(PY) $(addprefix --find-links ,$(FIND_LINKS))
$(STAMP): pyproject.toml
	@test -x $(PY) || $(BASE_PYTHON) -m venv $(VENV) || python3 -m venv --clear $(VENV)
	@if $(PY) -m pip install -q uv 2>/dev/null; then pip="$(UV_PIP)"; \
	else set -e; $(PY) -m pip install -q --upgrade pip; pip="$(PY) -m pip install -q"; fi; \
	set -ex; \
	$$pip "$(TORCH_SPEC)"; \
	$$pip -e ".[all,test]"; \
	$$pip --upgrade --no-deps --target $(VENV)/duckdb-2.0.1 duckdb==2.0.1
	@touch $(STAMP)

# Redis, Chromium, PostgreSQL (the shared store's tests), Prometheus and Alertmanager (the monitoring tests) come from Debian's packages; installed only when missing.
system-deps:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v chromium >/dev/null || missing="$$missing chromium chromium-driver"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	{ command -v promtool >/dev/null && command -v prometheus >/dev/null; } || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

models: $(STAMP)
	$(VENV)/bin/specdec models fetch

DEMO_LOG := data/demo/requests.jsonl.gz

$(DB): $(STAMP) $(DEMO_LOG)
	$(VENV)/bin/specdec ingest $(DEMO_LOG) --db $(DB)

# A demo database made by an older version is brought up to date first (the dashboard only reads).
run: models $(DB)
	$(VENV)/bin/specdec migrate --db $(DB)
	$(BYTECODE) $(VENV)/bin/specdec dashboard --db $(DB) --host 127.0.0.1 --port $(PORT)

# docs/cli.md's section of every command's --help, written again from the parser (a test checks it).
cli-docs: $(STAMP)
	$(PY) tests/docs/test_cli_reference.py --write

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# On every core: each test module stays on one worker (--dist loadfile, in pyproject.toml), so a module's
# servers and models start once; the longest modules go first (tests/conftest.py), not the ones with most tests.
# One worker more than cores: a fifth of a worker's time is spent waiting on the servers and browsers its tests
# start, which the extra worker fills (a fresh clone on 2 cores: 406 s against 428 s for the whole run).
# TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
test: $(STAMP) system-deps lint
	$(BYTECODE) $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS)

# The whole suite, recording each module's time into tests/durations.json: the order the workers take the
# modules in (the longest first). Run it after adding a long module, and commit the file.
durations: $(STAMP) system-deps lint
	$(BYTECODE) $(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --record-durations

# The README's screenshots: every page of the demo at 1440x900 and 390x844, taken by the browser test.
screenshots: $(STAMP) system-deps
	SPECDEC_SCREENSHOTS=data/screenshots $(PY) -m pytest -q tests/browser/test_incident_flow.py -k screenshots

bench: $(STAMP)
	@for s in bench/bench_*.py; do echo "== $$s"; $(PY) $$s || exit 1; done

clean:
	rm -rf $(VENV) data/models $(DB) test-output

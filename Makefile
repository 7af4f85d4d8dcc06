# Developer entry points. Every target calls the .venv binaries explicitly, so nothing needs
# to be activated first. `make lab` and `make test` work on a fresh machine.

VENV          := .venv
BIN           := $(CURDIR)/$(VENV)/bin
PY            := $(BIN)/python
PIP           := $(PY) -m pip
JLPM          := $(BIN)/jlpm
JUPYTER       := $(BIN)/jupyter
TORCH_VERSION := 2.13.0
PYTHON        ?= $(shell command -v python3.11 || command -v python3)
# Set up once; redone when the Python or npm dependencies change.
SETUP_STAMP   := $(VENV)/.jupyter_pause-setup
ALLOW_ROOT    := $(if $(filter 0,$(shell id -u)),--allow-root,)
LAB_ARGS      ?=

# jlpm scripts call `jupyter builder ...`: make the .venv's jupyter the one they find.
export PATH := $(BIN):$(PATH)

.PHONY: setup lab test lint bench

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

setup: $(PY)
	@# A develop symlink from a previous setup would make pip write install.json into the
	@# source tree (and the next wheel build fail on the duplicate): start from none.
	@if [ -L $(VENV)/share/jupyter/labextensions/jupyter-pause ]; then rm $(VENV)/share/jupyter/labextensions/jupyter-pause; fi
	rm -f jupyter_pause/labextension/install.json
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e ".[test]"
	$(JLPM) install
	$(JLPM) build
	$(JUPYTER) builder develop --overwrite .
	$(JUPYTER) server extension enable --sys-prefix jupyter_pause
	touch $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml package.json
	$(MAKE) setup

lab: setup
	$(JUPYTER) lab --ServerApp.root_dir=examples $(ALLOW_ROOT) $(LAB_ARGS) examples/demo.ipynb

# Runs every check (Python and TypeScript linters, jest, the galata ui-tests in Debian's
# chromium, pytest), then exits non-zero if any failed: with pytest's own exit status when
# pytest failed.
test: $(SETUP_STAMP)
	@status=0; \
	$(BIN)/ruff check . || status=1; \
	$(BIN)/ruff format --check . || status=1; \
	$(JLPM) lint:check || status=1; \
	$(JLPM) test || status=1; \
	(cd ui-tests && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(JLPM) install && $(JLPM) playwright test) || status=1; \
	$(BIN)/pytest -p no:cacheprovider; pytest_status=$$?; \
	if [ $$pytest_status -ne 0 ]; then exit $$pytest_status; fi; \
	exit $$status

lint: $(SETUP_STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .
	$(JLPM) lint

bench: $(SETUP_STAMP)
	$(PY) -c "import dill, kishu" 2>/dev/null || $(PIP) install -e ".[bench]"
	$(PY) bench/bench_checkpoint.py

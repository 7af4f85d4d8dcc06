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
CHROMIUM      ?= /usr/bin/chromium

# jlpm scripts call `jupyter builder ...`: make the .venv's jupyter the one they find.
export PATH := $(BIN):$(PATH)

.PHONY: setup lab hub watch test browser lint mutants bench docs

# pip's live progress bars on a terminal only (decided when the recipe runs, on its own
# stdout): a CI log gets pip's line per package instead.
PIP_INSTALL   := $(PIP) install --progress-bar $$([ -t 1 ] && echo on || echo off)

$(PY):
	@echo "[setup] creating the virtual environment in $(VENV) ($(PYTHON))"
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip

# ~3-4 min the first time (torch and ~160 packages, then the frontend build); a line per
# stage, and pip's and jlpm's own progress, so a long step is never silent.
setup: $(PY)
	@# A develop symlink from a previous setup would make pip write install.json into the
	@# source tree (and the next wheel build fail on the duplicate): start from none.
	@if [ -L $(VENV)/share/jupyter/labextensions/jupyter-pause ]; then rm $(VENV)/share/jupyter/labextensions/jupyter-pause; fi
	rm -f jupyter_pause/labextension/install.json
	@echo "[1/5] installing torch $(TORCH_VERSION) (CPU wheel, from a local wheel folder when PIP_FIND_LINKS names one)"
	$(PIP_INSTALL) torch==$(TORCH_VERSION)
	@echo "[2/5] installing jupyter_pause (editable) and its test dependencies"
	$(PIP_INSTALL) -e ".[test]"
	@echo "[3/5] installing the frontend's npm packages (jlpm install)"
	$(JLPM) install
	@echo "[4/5] building the JupyterLab extension (jlpm build)"
	$(JLPM) build
	@echo "[5/5] linking the extension into JupyterLab and enabling the server extension"
	$(JUPYTER) builder develop --overwrite .
	$(JUPYTER) server extension enable --sys-prefix jupyter_pause
	touch $(SETUP_STAMP)
	@echo "[setup] done: make lab starts JupyterLab, make test runs the tests"

$(SETUP_STAMP): pyproject.toml package.json
	$(MAKE) setup

lab: $(SETUP_STAMP)
	$(JUPYTER) lab --ServerApp.root_dir=examples $(ALLOW_ROOT) $(LAB_ARGS) examples/demo.ipynb

# A real JupyterHub on this machine (deploy/jupyterhub/jupyterhub_config.py, its demo mode):
# log in at http://127.0.0.1:8000 with any name and the password "pause"; each user's server
# (home in hub/home/<name>, the demo notebook in it) runs JupyterLab with jupyter_pause, and a
# Pause gives the server back to the Hub. HUB_ARGS: more jupyterhub options (e.g. --port=8001).
HUB_ARGS      ?=
hub: $(SETUP_STAMP)
	@mkdir -p hub/home
	cd hub && JUPYTER_PAUSE_HUB_DEMO=$(CURDIR)/hub JUPYTER_PAUSE_HUB_DEMO_NOTEBOOK=$(CURDIR)/examples/demo.ipynb \
		$(BIN)/jupyterhub -f $(CURDIR)/deploy/jupyterhub/jupyterhub_config.py $(HUB_ARGS)

# Rebuilds the frontend on every change (with the .venv's jupyter, nothing to activate).
watch: $(SETUP_STAMP)
	$(JLPM) watch

# The galata ui-tests drive Debian's chromium; Playwright never downloads a browser here.
browser:
	@if [ ! -x "$(CHROMIUM)" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "Installing Debian's chromium for the UI tests"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
		else \
			echo "make test needs a chromium at $(CHROMIUM) for the UI tests: install Debian's (sudo apt-get install chromium) or set CHROMIUM=/path/to/chromium"; \
			exit 1; \
		fi; \
	fi

# Runs every stage (Python and TypeScript linters, the docs, jest, the galata ui-tests, pytest) even
# when one fails, then prints one line per stage and fails if any did. A failed stage's errors
# (its lines that say what failed, up to 15) come again just before that summary, so that the
# last lines of a CI log say why, however long the stages after it ran.
test: $(SETUP_STAMP) browser
	@summary=""; failed=0; log=$$(mktemp); errors=$$(mktemp); \
	stage() { name=$$1; shift; echo "=== $$name"; \
		{ "$$@"; echo $$? > $$log.rc; } 2>&1 | tee $$log; \
		if [ "$$(cat $$log.rc)" = 0 ]; then summary="$$summary  $$name: passed\n"; \
		else summary="$$summary  $$name: FAILED\n"; failed=1; echo "--- $$name:" >> $$errors; \
			sed -e 's/\x1b\[[0-9;]*m//g' -e '/^--- the last 80 lines of the server log/,$$d' $$log > $$log.plain; \
			{ grep -E '^(FAILED|ERROR) [^ ]' $$log.plain; grep -vE '^(DEBUG|INFO|WARNING|ERROR|CRITICAL)  |^(FAILED|ERROR) [^ ]' $$log.plain \
			| grep -E 'Error|Expected|Received|✘|●|^E  | error |[0-9]+ errors?|[Ww]ould reformat|\.spec\.ts:[0-9]|\.py:[0-9]+:[0-9]+'; } \
			| head -n 15 | cut -c1-240 >> $$errors; fi; }; \
	stage ruff sh -c '$(BIN)/ruff check . && $(BIN)/ruff format --check .'; \
	stage lint $(JLPM) lint:check; \
	stage docs $(BIN)/mkdocs build --strict; \
	stage jest $(JLPM) test; \
	stage ui-tests sh -c 'cd ui-tests && rm -f server.log && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 $(JLPM) install && { CHROMIUM_PATH=$(CHROMIUM) $(JLPM) playwright test || { \
		if [ -f server.log ]; then echo "--- the last 80 lines of the server log, ui-tests/server.log:"; tail -n 80 server.log; fi; exit 1; }; }'; \
	stage ui-tests-kernel-pods sh -c 'cd ui-tests && rm -f server-kernel-pods.log && { CHROMIUM_PATH=$(CHROMIUM) $(JLPM) playwright test -c playwright-kernel-pods.config.js || { \
		if [ -f server-kernel-pods.log ]; then echo "--- the last 80 lines of the server log, ui-tests/server-kernel-pods.log:"; tail -n 80 server-kernel-pods.log; fi; exit 1; }; }'; \
	stage ui-tests-hub sh -c 'cd ui-tests && rm -f server-hub.log && { CHROMIUM_PATH=$(CHROMIUM) $(JLPM) playwright test -c playwright-hub.config.js || { \
		if [ -f server-hub.log ]; then echo "--- the last 80 lines of the server log, ui-tests/server-hub.log:"; tail -n 80 server-hub.log; fi; exit 1; }; }'; \
	stage pytest $(BIN)/pytest -p no:cacheprovider -rfEs; \
	if [ -s $$errors ]; then printf "\nwhat failed:\n"; cat $$errors; fi; \
	rm -f $$log $$log.rc $$log.plain $$errors; \
	printf "\nmake test:\n$$summary"; \
	exit $$failed

# The manual (docs/, mkdocs.yml) into site/; a warning (a broken link or anchor) fails it.
docs: $(SETUP_STAMP)
	$(BIN)/mkdocs build --strict

lint: $(SETUP_STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .
	$(JLPM) lint

# Plant each bug of tests/mutants/plants.py, run the tests that must catch it, report.
mutants: $(SETUP_STAMP)
	$(PY) -m tests.mutants.run --report tests/README.md

bench: $(SETUP_STAMP)
	$(PY) -c "import dill, kishu, safetensors, matplotlib" 2>/dev/null || $(PIP) install -e ".[bench]"
	$(PY) bench/bench_checkpoint.py

# Every target installs what it needs, so each works from a fresh clone with nothing installed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip -q --disable-pip-version-check
# The local CPU wheel here; on a GPU machine: make TORCH_SPEC=torch ...
TORCH_SPEC ?= torch==2.13.0
# The prompt of `make run`; \n and other escapes are expanded (printf %b).
PROMPT ?= import os\n\ndef list_files(path):

.PHONY: run test docs wheel-check install install-dev install-docs export check-export clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e .

install-dev: $(BIN)/python
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e ".[dev]"

install-docs: install-dev
	$(PIP) install -e ".[docs]"
	$(PIP) install --no-deps "jupyter-server-mathjax>=0.2"   # MathJax files only, so pages render maths offline

## run: the main job on the shipped tiny-dense model
run: install
	$(BIN)/inferlab generate "$$(printf '%b' '$(PROMPT)')" --max-tokens 96 --temperature 0.7 --top-p 0.95 --seed 0

export: install-dev
	$(BIN)/nbdev-export

## check-export: the package must be exactly what the notebooks export
check-export: export
	@changed="$$(git status --porcelain -- inferlab)"; \
	if [ -n "$$changed" ]; then echo "$$changed"; echo "nbdev-export changed inferlab/: run nbdev-export and commit"; exit 1; fi

## test: everything CI runs: export check, every notebook (one test each), tests/
test: check-export
	MPLBACKEND=Agg $(BIN)/python -m pytest tests

## docs: the site, built offline from the executed notebooks into _site/
docs: install-docs
	MPLBACKEND=Agg $(BIN)/python docs/build.py

## wheel-check: build the wheel, install it into a fresh venv outside the repository, generate there
wheel-check: install-dev
	rm -rf dist && $(BIN)/python -m build --wheel -o dist
	tmp=$$(mktemp -d) && wheel=$$(ls $(CURDIR)/dist/*.whl) && $(PYTHON) -m venv $$tmp/venv && \
	$$tmp/venv/bin/python -m pip -q --disable-pip-version-check install "$(TORCH_SPEC)" "$$wheel" && \
	cd $$tmp && $$tmp/venv/bin/inferlab --help && \
	$$tmp/venv/bin/inferlab generate "$$(printf '%b' '$(PROMPT)')" --max-tokens 48 --seed 0 && rm -rf $$tmp

clean:
	rm -rf _proc _docs _site build dist *.egg-info

# Every target does its own set-up: a fresh Debian machine with Python 3 needs nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test lint bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned, so that no several-GB CUDA build is pulled in by a range.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[build,test]"
	touch $(STAMP)

setup: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/engine.py

bench-quick: $(STAMP)
	$(PY) bench/engine.py --quick

clean:
	rm -rf $(VENV) .pytest_cache

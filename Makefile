# Silbo: the two set-up commands are `make demo` and `make test`; both install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test lint typecheck pytest demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[spark,bench,test]'
	touch $(STAMP)

lint: install
	$(PY) -m ruff check broker spark_matcher tests
	$(PY) -m ruff format --check broker spark_matcher tests

typecheck: install
	$(PY) -m mypy

pytest: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test: lint typecheck pytest

demo: install
	$(VENV)/bin/silbo demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

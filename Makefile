# Silbo: the two set-up commands are `make demo` and `make test`; both install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install bytecode mosquitto test test-fast lint typecheck pytest demo bench clean

install: $(STAMP) mosquitto

# the MQTT broker the MQTT notification tests run (tests/ngsi/test_mqtt.py skips without it);
# installed where it can be (root, a Debian apt), never a failure
mosquitto:
	@command -v mosquitto >/dev/null || test -x /usr/sbin/mosquitto || \
		(apt-get install -y mosquitto >/dev/null 2>&1 || \
		 (apt-get update -qq && apt-get install -y -qq mosquitto >/dev/null)) 2>/dev/null || \
		echo "mosquitto not installable: MQTT tests will skip"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[spark,archive,bench,test]'
	touch $(STAMP)

# The broker's own modules compiled once (pip compiled the libraries'): a process imports
# them from source otherwise when PYTHONDONTWRITEBYTECODE is set (it is on this machine), and
# every process of every test cluster compiled them again (a quarter of its start's CPU).
bytecode: install
	$(PY) -m compileall -q broker spark_matcher >/dev/null

lint: install
	$(PY) -m ruff check broker spark_matcher tests
	$(PY) -m ruff format --check broker spark_matcher tests

typecheck: install
	$(PY) -m mypy

# The suite runs on pytest-xdist workers, 2 on this 2-core machine (PYTEST_WORKERS=0 runs it
# serially); loadgroup keeps the Spark tests on one worker. 4 workers took 16.5 min of pytest
# and overloaded the machine enough to break timing-bound tests (fault injection, scales).
PYTEST_WORKERS ?= 2
export HYPOTHESIS_PROFILE ?= ci

pytest: install bytecode
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=20 $(PYTEST_ARGS)

# the unit and property tests only (no processes, no Spark)
test-fast: install bytecode
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

# lint and typecheck run beside the tests (one core for ~40 s while pytest starts): the whole
# takes ~40 s less than one after the other; any of the three failing fails the target.
test: install
	@$(MAKE) --no-print-directory -j3 lint typecheck pytest

demo: install bytecode
	$(VENV)/bin/silbo demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find broker spark_matcher -name __pycache__ -type d -prune -exec rm -rf {} +

# The two commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv when absent. torch is pinned and installed first so that pip takes the
# local 2.13.0 build instead of downloading a multi-GB one.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit test-slow test-swarm lint install clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pathswarm demo

# Both halves: tests/unit (pure, no network) and tests/swarm (real nodes and hivemind on 127.0.0.1).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q tests/unit tests/swarm

# The quick loop: pure tests only (about a minute).
test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

# Long runs kept out of the default suite (marked slow); CI runs them after it.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests/unit tests/swarm

test-swarm: $(STAMP)
	$(BIN)/python -m pytest -q tests/swarm

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info

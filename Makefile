# The two commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv when absent. torch is pinned and installed first so that pip takes the
# local 2.13.0 build instead of downloading a multi-GB one.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

LAYOUT := build/layout

.PHONY: demo test test-unit test-slow test-swarm lint imports types layout install clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,hf]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/pathswarm demo

# ruff, the layer contracts and the type checker (seconds), then both halves of the suite: tests/unit (pure, no
# network) and tests/swarm (real nodes and hivemind on 127.0.0.1).
test: lint imports types
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

# The layers (protocol never imports node, hivemind only behind protocol/net/, ...): contracts in .importlinter.
imports: $(STAMP) layout
	cd $(LAYOUT) && $(CURDIR)/$(BIN)/lint-imports $(CURDIR)/.importlinter

# mypy on the packages mypy.ini lists.
types: $(STAMP) layout
	cd $(LAYOUT) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/mypy.ini

# import-linter and mypy find a package by its folder, and setup.cfg maps pathswarm's subpackages to the top-level
# folders: both read the package through links that lay it out as it is installed, in $(LAYOUT)/pathswarm.
layout:
	rm -rf $(LAYOUT)/pathswarm
	mkdir -p $(LAYOUT)/pathswarm
	ln -s $(CURDIR)/pathswarm/*.py $(addprefix $(CURDIR)/,node protocol compression bootstrap) $(LAYOUT)/pathswarm/

clean:
	rm -rf $(VENV) build *.egg-info

# Two commands for a new user: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-all bench lint fix clean

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-dev.txt -e '.[dev,serve]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/bubblecast demo --out bubblecast-demo

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m "" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

lint: $(STAMP)
	$(BIN)/ruff check bubblecast tests benchmarks

fix: $(STAMP)
	$(BIN)/ruff check --fix bubblecast tests benchmarks

clean:
	rm -rf $(VENV) bubblecast-demo .pytest_cache .ruff_cache

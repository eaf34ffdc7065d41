# Two commands for a new user: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-all fuzz bench lint fix clean wheel-check

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints-dev.txt -e '.[dev,serve,fleet]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/bubblecast demo --out bubblecast-demo

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m "" $(PYTEST_ARGS)

# The property tests with fresh random examples (`make test` draws the same ones every run: the
# profiles in tests/conftest.py); a failure prints the blob that reproduces it.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=explore $(BIN)/python -m pytest -q -m hypothesis $(PYTEST_ARGS)

# The slow tests include tests/test_wheel.py's whole wheel check (what `make wheel-check` runs).
bench: $(STAMP) fuzz
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# ruff, the import-linter contracts of pyproject.toml (layers, no cycles), the size guide
# (modules <= 600 lines, functions <= 80, allow-list in tools/size_check.py) and the
# private-name rule (tools/private_imports.py): all four run, and lint fails if any fails.
lint: $(STAMP)
	@status=0; \
	$(BIN)/ruff check bubblecast tests benchmarks tools || status=1; \
	$(BIN)/lint-imports --no-cache --no-logo || status=1; \
	$(BIN)/python tools/size_check.py bubblecast || status=1; \
	$(BIN)/python tools/private_imports.py bubblecast || status=1; \
	exit $$status

fix: $(STAMP)
	$(BIN)/ruff check --fix bubblecast tests benchmarks tools

# The wheel outside the repository: build it (python -m build), install it into a fresh venv
# (dependencies reused from .venv, nothing downloaded) and run `bubblecast demo --quick` from an
# empty folder (tools/check_wheel.py; 2 to 5 minutes on 2 cores).
wheel-check: $(STAMP)
	$(BIN)/python tools/check_wheel.py

clean:
	rm -rf $(VENV) bubblecast-demo .pytest_cache .ruff_cache site

# The documentation site (mkdocs.yml) into site/: installs the `docs` extra into .venv on first
# use (kept out of `make test`'s install), checks that docs/results.md matches
# benchmarks/results/*.json, and fails on any MkDocs warning (broken links and anchors included).
.PHONY: docs
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP) pyproject.toml constraints-dev.txt
	$(BIN)/python -m pip install -q -c constraints-dev.txt -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/python tools/results_page.py --check
	$(BIN)/mkdocs build --strict -d site

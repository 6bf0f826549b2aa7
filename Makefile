# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck unit demo bench clean

$(STAMP): pyproject.toml requirements-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: the CPU build on local disk (a loose requirement pulls a CUDA build).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements-test.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict rngaudit tests

unit: $(STAMP)
	$(VENV)/bin/pytest -q -p no:cacheprovider

test: lint typecheck unit

demo: $(STAMP)
	$(PY) examples/demo.py

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) rngaudit-report .mypy_cache .ruff_cache

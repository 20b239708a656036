# brooq_py developer tasks. `make` (or `make help`) lists them.
#
# Needs only Python >= 3.11 and make: `make install` builds .venv/ from pyproject.toml.
# Database: the demo, the tests and the benchmarks find one themselves (brooq_py.devdb):
# DATABASE_URL if set, else PostgreSQL on 127.0.0.1:5432, else a throwaway local server.

PYTHON ?= python3
VENV ?= .venv
COMPOSE ?= docker compose
PY := $(VENV)/bin/python
STAMP := $(VENV)/.install-stamp
# Django 6 needs Python >= 3.12 while brooq_py supports 3.11: its tests get a venv of their own,
# made with the newest Python >= 3.12 found (PATH, then pyenv), or DJANGO_PYTHON=/path/to/python3.12.
DJANGO_VENV ?= .venv-django
DJANGO_PYTHON ?= $(shell bash tests/django_project/newest-python.sh)
DJANGO_STAMP := $(DJANGO_VENV)/.install-stamp
SOURCES := $(wildcard brooq_py tests bench examples)  # bench/ may not exist yet

.DEFAULT_GOAL := help
.PHONY: help install install-django test-django demo test screenshots lint fmt typecheck check wheel-check bench bench-pressure migrate-up migrate-down migrate-status \
	db-up db-down clean distclean require-database-url

help: ## show this help
	@echo "usage: make <target> [PYTHON=python3.11]"
	@echo
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-15s %s\n", $$1, $$2}'

install: $(STAMP) ## create .venv and install the package with its dev tools (again when pyproject.toml changes)

$(STAMP): pyproject.toml
	@if [ ! -x "$(PY)" ]; then \
		command -v "$(PYTHON)" >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python >= 3.11 or run make PYTHON=/path/to/python3.11" >&2; exit 1; }; \
		"$(PYTHON)" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
			echo "error: brooq_py needs Python >= 3.11, but $(PYTHON) is $$("$(PYTHON)" -V 2>&1)." >&2; \
			echo "       run make PYTHON=python3.11 (or newer)" >&2; exit 1; }; \
		echo "creating $(VENV) with $$("$(PYTHON)" -V 2>&1)"; \
		"$(PYTHON)" -m venv "$(VENV)" || { \
			echo "error: '$(PYTHON) -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2; exit 1; }; \
	fi
	@"$(PY)" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
		echo "error: $(VENV) runs $$("$(PY)" -V 2>&1); brooq_py needs >= 3.11. Remove $(VENV) (make distclean) and retry." >&2; exit 1; }
	"$(PY)" -m pip install --quiet -e '.[dev]'
	@touch "$@"

demo: install ## run the demo against the database devdb finds
	"$(PY)" -m brooq_py.demo

# xdist workers of `make test` (tests/budget.py: 40 connections to the test server in all, shared
# among them; docs/development.md, "Test suite"). The fault-injection tests (tests/chaos) and the
# depth caps' anchor tests run beside the rest, on throwaway servers of their own
# (tests/conftest.py, OWN_SERVER_GROUPS). Work stealing: a worker that runs out takes the queued
# tests of a busier one, so a run of long tests at the end no longer waits on one worker
# (6 m 32 s -> 5 m 08 s quiet).
TEST_WORKERS ?= 4
PYTEST_ARGS ?= -n $(TEST_WORKERS) --dist worksteal --durations=20 --timeout=600

test: install ## run the test suite (pytest tests/ on TEST_WORKERS xdist workers), then the Django tests in their own venv
	@py=0; dj=0; \
	"$(PY)" -m pytest $(PYTEST_ARGS) tests || py=$$?; \
	$(MAKE) --no-print-directory test-django || dj=$$?; \
	if [ $$py -ne 0 ] || [ $$dj -ne 0 ]; then \
		echo "*** make test failed: pytest exit status $$py, Django tests exit status $$dj" >&2; exit 1; \
	fi

test-django: ## the Django 6 tests (tests/django_project) in $(DJANGO_VENV), Python >= 3.12
	@if [ -z "$(DJANGO_PYTHON)" ]; then \
		echo "*** Django tests NOT run: no Python >= 3.12 found (Django 6 needs it)." >&2; \
		echo "*** Install one, or run make test-django DJANGO_PYTHON=/path/to/python3.12" >&2; \
		if [ -n "$$BROOQ_REQUIRE_DJANGO" ]; then exit 1; else exit 0; fi; \
	fi; \
	$(MAKE) --no-print-directory install-django && \
	echo "Django tests with $$("$(DJANGO_VENV)/bin/python" -V) in $(DJANGO_VENV)" && \
	"$(DJANGO_VENV)/bin/python" -m pytest tests/django_project

install-django: $(DJANGO_STAMP) ## create $(DJANGO_VENV) (newest Python >= 3.12) with brooq_py[django] and pytest

$(DJANGO_STAMP): pyproject.toml
	@[ -n "$(DJANGO_PYTHON)" ] || { echo "error: no Python >= 3.12 found for Django 6; set DJANGO_PYTHON" >&2; exit 1; }
	@if [ ! -x "$(DJANGO_VENV)/bin/python" ]; then \
		echo "creating $(DJANGO_VENV) with $$("$(DJANGO_PYTHON)" -V 2>&1)"; \
		"$(DJANGO_PYTHON)" -m venv "$(DJANGO_VENV)"; \
	fi
	"$(DJANGO_VENV)/bin/python" -m pip install --quiet -e '.[django]' 'pytest>=8'
	@touch "$@"

screenshots: install ## retake docs/dashboard-*.png in the browser tests' headless Chromium
	BROOQ_SCREENSHOTS=1 "$(PY)" -m pytest -q tests/web/test_dashboard_browser.py -k screenshots

lint: install ## ruff check and ruff format --check
	"$(VENV)/bin/ruff" check $(SOURCES)
	"$(VENV)/bin/ruff" format --check $(SOURCES)

fmt: install ## format the code and apply safe lint fixes
	"$(VENV)/bin/ruff" format $(SOURCES)
	"$(VENV)/bin/ruff" check --fix $(SOURCES)

typecheck: install ## mypy --strict on the package
	"$(VENV)/bin/mypy" --strict brooq_py

check: lint typecheck test ## lint, typecheck and test: what CI runs (with wheel-check)

wheel-check: install ## build the sdist and wheel, twine check them, and run the wheel from a fresh virtualenv
	DEV_PYTHON="$(PY)" PYTHON="$(PYTHON)" .ci/wheel-check

bench: install ## run the benchmarks (DASH: dashboard pages over 1,000,000 jobs) against the database devdb finds; the held-horizon bench is bench-pressure
	"$(PY)" bench/run.py

bench-pressure: install ## SPEC B1 on throwaway servers: brooq_py, pgqueuer, procrastinate under a held xid (about 2.5 h; ARGS=--quick: 20 min)
	"$(PY)" -m pip install --quiet -e '.[bench]'
	"$(PY)" bench/pressure.py $(ARGS)

migrate-up: require-database-url install ## apply all migrations on the database at DATABASE_URL
	"$(PY)" -m brooq_py migrate up

migrate-down: require-database-url install ## roll back one migration on DATABASE_URL
	"$(PY)" -m brooq_py migrate down

migrate-status: require-database-url install ## show the migration state of DATABASE_URL
	"$(PY)" -m brooq_py migrate status

db-up: ## start PostgreSQL 15 on 127.0.0.1:5432 with Docker (docker-compose.yml)
	USER="$${USER:-$$(id -un)}" $(COMPOSE) up -d --wait postgres
	@echo "PostgreSQL is up: the demo, tests and benchmarks find it on 127.0.0.1:5432 by themselves;"
	@echo "for the migrate targets: export DATABASE_URL=postgresql://$${USER:-$$(id -un)}@127.0.0.1:5432/test"

db-down: ## stop the Docker PostgreSQL (its data volume is kept; docker compose down -v drops it)
	USER="$${USER:-$$(id -un)}" $(COMPOSE) down

clean: ## remove caches and build output (keeps .venv)
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info "$(STAMP)"
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean ## clean, and remove .venv (and the Django venv) too
	rm -rf "$(VENV)" "$(DJANGO_VENV)"

require-database-url:
	@[ -n "$$DATABASE_URL" ] || { \
		echo "error: DATABASE_URL is not set. Point it at the database to migrate, e.g." >&2; \
		echo "  export DATABASE_URL=postgresql://$$(id -un)@127.0.0.1:5432/test   (local server)" >&2; \
		echo "  make db-up && export DATABASE_URL=postgresql://$$(id -un)@127.0.0.1:5432/test   (Docker)" >&2; \
		exit 1; }

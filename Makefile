PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-citus chaos chaos-citus bench lint db-stop clean

# The stamps make a second `make run` (or `make test`) skip pip unless requirements changed.
# `make run` installs only what the product runs (requirements.txt); the tests, benchmarks
# and tooling add requirements-dev.txt.
$(VENV)/.installed: requirements.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	@$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	@$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	@touch $@

run: $(VENV)/.installed
	@$(BIN)/python scripts/dev.py run

# The console tests drive Debian's headless Chromium and /metrics is checked with promtool;
# as root both are installed from Debian's packages if missing.
test: $(VENV)/.installed-dev
	@bash scripts/ensure_test_tools.sh
	@$(BIN)/python scripts/dev.py test $(PYTEST_ARGS)

# The database-facing tests, the exactly-once process test and a short bench on a local
# Citus coordinator + 2 workers (var/citus/, stopped at the end); needs Citus installed
# from its vendor's packages. PYTEST_ARGS replaces the list of test files.
test-citus: $(VENV)/.installed-dev
	@$(BIN)/python scripts/dev.py test-citus $(PYTEST_ARGS)

# About 15 minutes, not part of `make test` (which runs its short form, tests/test_chaos.py):
# 2 schedulers, 3 executors, 5,000 interval jobs, kills, stalls and database outages on a
# private cluster; prints the counts and writes them to var/chaos-report.json.
# CHAOS_ARGS e.g. '--duration 300 --jobs 2000' (python -m tests.chaos --help).
chaos: $(VENV)/.installed-dev
	@$(BIN)/python -m tests.chaos --report var/chaos-report.json $(CHAOS_ARGS)

# About 15 minutes, not part of `make test-citus` (which runs its short form,
# tests/test_chaos_citus.py): `make chaos` on a private Citus coordinator + 2 workers
# (var/private-citus/, removed at the end) with 2,000 jobs, plus a worker crashed for
# 20 s, a coordinator restart, a shard moved under load and a third worker added and
# rebalanced; prints the counts, the time each fault took to heal and the healthy
# workers' rate during the worker outage, and writes them to var/chaos-citus-report.json.
chaos-citus: $(VENV)/.installed-dev
	@$(BIN)/python scripts/citus_cluster.py available
	@$(BIN)/python -m tests.chaos --citus --report var/chaos-citus-report.json $(CHAOS_ARGS)

# About 15 minutes (< 20), not part of `make test` (which runs its smoke form,
# tests/test_bench_harness.py): dispatch, executors (task and HTTP), end-to-end lag, the
# ledger and the load forecast, each beside its raw limit in the same run; writes docs/BENCHMARKS.md and
# docs/bench/*.png, raw numbers in var/bench/. With Citus installed it adds Citus rows
# (bench/citus.py: a local 3-node cluster under var/citus/, a few minutes more).
# BENCH_ARGS e.g. '--full' (adds 1M jobs), '--runs 30000', '--no-citus' (python -m bench --help).
bench: $(VENV)/.installed-dev
	@$(BIN)/python scripts/dev.py bench $(BENCH_ARGS)

lint: $(VENV)/.installed-dev
	@$(BIN)/ruff check .
	@$(BIN)/ruff format --check .

db-stop:
	@$(PYTHON) scripts/embedded_pg.py stop
	@test ! -d var/citus || $(PYTHON) scripts/citus_cluster.py stop

# destroy also removes a cluster that lives outside var/ (var/pg is then a symlink).
clean:
	@$(PYTHON) scripts/embedded_pg.py destroy
	@test ! -d var/citus || $(PYTHON) scripts/citus_cluster.py destroy
	rm -rf $(VENV) var

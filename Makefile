# Two commands on a fresh machine with only Python 3.11, Java 17 and make:
#   make run   - set everything up, run the main job (ingest -> fit -> predict -> evaluate -> generate ->
#                surrogate -> report) on the embedded synthetic data; prints the metrics and the report path
#   make test  - set everything up, run the tests (all of them: CI runs this)
#   make test-fast - the same without the tests marked slow or cluster
# Both build the docs site first (mkdocs build --strict: a broken link or anchor fails; docs/gen_reference.py
# regenerates the reference pages from the code) into $(DOCS_SITE), which git ignores.
# Delta Lake's jars are fetched from Maven Central by Spark's Ivy resolver on the first session
# (delta-spark's configure_spark_with_delta_pip) and cached in ~/.ivy2.5.2.

PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONF   ?= conf/local.yaml
# Two pytest-xdist workers, whole files to each (tests/conftest.py schedules them): the suite waits on JVM
# round trips and subprocesses often enough that two keep 2 cores busier than one (CI 32:07 -> 27:26-28:45;
# 24:14 with the JIT thresholds x3; benchmarks/RESULTS.md). TEST_WORKERS=0: serially.
TEST_WORKERS ?= 2
DOCS_SITE ?= .docs-site
# mkdocs-material prints a banner about MkDocs 2.0 on every build
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup run test test-fast targets clean

setup: $(STAMP)

# --no-compile: pip would byte-compile every module of every package (the install took 38.5 s with it here,
# 14.0 s without); Python compiles the modules a run imports, on first import, and caches them
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev,docs]'
	touch $(STAMP)

run: setup
	$(BIN)/clickeval run --conf $(CONF)

# lint-imports: the layer contract in pyproject.toml ([tool.importlinter]), a second or two
test: setup
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

# everything but the tests marked slow (whole pipelines, subprocess clients, the reliability baseline) or cluster
test-fast: setup
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not slow and not cluster"

# the fit's targets (issue 57) from one command: the 1M and 10M fit stages, EM per pass, `make run` (~40 min)
targets: setup
	$(BIN)/python -m benchmarks.targets

clean:
	rm -rf $(VENV) .venv-airflow warehouse spark-warehouse reports dist .pytest_cache $(DOCS_SITE)

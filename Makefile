# pgrouter — the two commands of the README: `make demo` and `make test` (and `make docs`).
# Both set up everything on a fresh Debian machine: system packages (PostgreSQL, Java, Maven,
# gcc and Python's headers for the C hot path, Prometheus for the metrics test) when missing, a virtual environment in .venv/ with the Python packages, and the Kafka and
# Spark jars and the schema registry from Maven Central (fetched by `python -m devstack up` into .devstack/cache).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# the install is redone when the package definition or the C accelerator changes
NATIVE := $(wildcard router/_native/*.[ch] router/_native/*/*.[ch] actors/kafka/*.c)
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py $(NATIVE) | cksum | cut -d' ' -f1)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# PostgreSQL major version of a new dev stack (15–18; empty: the newest, 18); an existing
# stack keeps the version it was made with
PG_VERSION ?=
STACK  := $(BIN)/python -m devstack up --pg-port auto --kafka-port auto $(if $(PG_VERSION),--pg-version $(PG_VERSION))
PYTEST_ARGS ?=

.PHONY: test demo docs system venv stack spark-cluster down bench clean materialize-bundle

# two workers, then the tests that must run alone (tests/conftest.py SERIAL), then the C's
# pure-Python twins; TEST_WORKERS=1 runs the first part in one process (exit 5: PYTEST_ARGS
# left a part without tests)
TEST_WORKERS ?= 2
test: venv stack
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not serial" --durations=30 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest -m serial --durations=15 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	# the pure-Python twins of the C hot path (router/_native/), as on machines without a compiler
	PGROUTER_PURE_PYTHON=1 $(BIN)/python -m pytest -q tests/router tests/actors

demo: venv stack
	$(BIN)/python -m devstack.demo

# the documentation site (docs/, mkdocs.yml) into site/; strict: a dead link or a page missing
# from the nav fails
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

# System packages the stack needs, installed only when missing.
system:
	@missing=""; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	command -v mvn  >/dev/null 2>&1 || missing="$$missing maven"; \
	command -v gcc  >/dev/null 2>&1 || missing="$$missing gcc"; \
	command -v prometheus >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql postgresql-contrib"; \
	$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	$(PYTHON) -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null \
	  || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# byte-compiled once here, so a process start does not compile every module again (also
# where PYTHONDONTWRITEBYTECODE keeps Python from writing its caches; only changed files redo)
venv: system $(STAMP)
	@$(BIN)/python -m compileall -q router actors devstack bench >/dev/null

$(STAMP): pyproject.toml setup.py $(NATIVE)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev,spark,librdkafka,postgres,docs,avro]'
	# the console's browser tests (its other dependencies are in the dev extra; see there)
	$(BIN)/pip install -q --no-deps selenium==4.52.0
	rm -f $(VENV)/.installed-*; touch $@

stack: venv
	$(STACK) --spark --connect

# a Spark standalone cluster (master + 2 workers) from pyspark's own distribution; prints its
# spark:// URL for [spark] master or spark-submit --master (README "Running on a Spark cluster")
spark-cluster: venv
	$(STACK) --spark --spark-cluster

down:
	-$(BIN)/python -m devstack down

# the Spark job as one zip for spark-submit --py-files (README "Materializing topics")
materialize-bundle: venv
	$(BIN)/python -m actors.materialize.bundle dist/pgrouter-materialize.zip

bench: venv stack
	$(BIN)/python bench/decode.py

clean: down
	rm -rf .devstack $(VENV)

# Two entry points (see README): `make demo` and `make test`.  Both create .venv and install
# what they need, so they work on a fresh machine with only Python 3.10+ (and Java for Spark).
# A maintainer's inner loop: `make unit` (the fast tests, see CONTRIBUTING.md) and `make lint`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
DISCOVERY := $(VENV)/.spark-discovery
KERNELS := $(VENV)/.kernels-cached

.PHONY: demo test unit lint bench clean reliability

# PYTHONWARNINGS: setuptools ends every editable install of a package-dir mapping (storage/ ->
# pylog.storage) with an informational warning about folders named like the package, which
# pyproject.toml has no setting for
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -e '.[dev,spark,s3,serve]'
	touch $(STAMP)

# format("pylog") found by Spark from any directory (the editable install hides pyspark_pylog from
# Spark's module scan: see the script); re-running it changes nothing
$(DISCOVERY): $(STAMP) scripts/spark_discovery.py
	$(PY) scripts/spark_discovery.py
	touch $(DISCOVERY)

# the codec's numba kernels compiled into numba's on-disk cache once per installation (again
# when their sources change), so that no query, Spark worker or command compiles them
$(KERNELS): $(STAMP) $(wildcard storage/codec/_kernels*.py)
	$(PY) -m pylog.tools.warm_kernels
	touch $(KERNELS)

demo: $(DISCOVERY) $(KERNELS)
	$(PY) examples/demo.py

lint: $(DISCOVERY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/lint.py

# the whole suite (what CI runs)
test: lint
	$(VENV)/bin/pytest -q -p no:cacheprovider

# everything but Spark, S3, child processes and long campaigns: the markers of tests/conftest.py
unit: $(KERNELS)
	$(VENV)/bin/pytest -q -p no:cacheprovider -m "not spark and not s3 and not subprocess and not slow"

reliability: $(DISCOVERY) $(KERNELS)
	$(PY) -m tests.reliability.campaign --long

bench: $(DISCOVERY) $(KERNELS)
	$(PY) bench/codec.py

clean:
	rm -rf $(VENV) build *.egg-info demo-data

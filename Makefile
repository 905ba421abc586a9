# `make demo` and `make test` create and fill .venv themselves when it is missing or pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
# mkdocs-material's notice about its successor, printed on every build
export NO_MKDOCS_2_WARNING := 1
# statsmodels fits are 10-20x slower when OpenBLAS threads fight other processes on a small machine
export OPENBLAS_NUM_THREADS ?= 1

.PHONY: venv demo test lint docs clean dynamo-env

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test,aic,docs]'
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/planner demo

lint: $(STAMP)
	$(VENV)/bin/ruff check planner_core planner_cli flows tests infra docs
	$(VENV)/bin/lint-imports

# The documentation site, into site/; --strict turns every warning (a broken link, a missing page) into a failure.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

test: lint docs
	$(VENV)/bin/python -m pytest -q

# The Dynamo comparison environment: Dynamo 1.6.1's own planner and mocker in a virtualenv of their own, for
# `planner bench --policies dynamo-1.6.1,...`, `python -m planner_core.lab.compare_mocker` and the Dynamo tests
# (found at .dynamo-venv/bin/python; $DYNAMO_PYTHON or --dynamo-python point elsewhere). ai-dynamo cannot go into
# .venv: it pins kubernetes<33 and pydantic<=2.13.5. Its wheel depends on AISimulate, which installs only from a
# vendor index, so it goes in without dependencies, followed by the dependencies it really imports; the stand-in
# for AISimulate's module is in planner_core/lab/dynamo/stubs.
DYNAMO_VENV := .dynamo-venv
DYNAMO_STAMP := $(DYNAMO_VENV)/.installed-ai-dynamo-1.6.1

$(DYNAMO_STAMP):
	@test -x $(DYNAMO_VENV)/bin/python || $(PYTHON) -m venv $(DYNAMO_VENV)
	$(DYNAMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DYNAMO_VENV)/bin/python -m pip install -q --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1
	$(DYNAMO_VENV)/bin/python -m pip install -q aiohttp msgspec 'kubernetes<33' prometheus-client pyzmq tqdm \
		'pydantic<=2.13.5' uvloop zstandard prometheus-api-client scikit-learn prophet pmdarima filterpy plotly
	$(DYNAMO_VENV)/bin/python planner_core/lab/dynamo/run_planner.py --check
	@touch $@

dynamo-env: $(DYNAMO_STAMP)

clean:
	-$(VENV)/bin/planner db stop
	rm -rf .planner site

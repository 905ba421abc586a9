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

.PHONY: venv demo test lint docs clean

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

clean:
	-$(VENV)/bin/planner db stop
	rm -rf .planner site

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
# Python caches the bytecode of what it imports (its default, which a shell may have turned off): the Dynamo and
# aiperf environments are installed with --no-compile to compile on first use, and the tests start Dynamo's
# planner, mocker and frontend again and again. With PYTHONDONTWRITEBYTECODE set, every start compiled Dynamo from
# source again (a planner start: 13 s of CPU instead of 4.5 s; test_dynamo_policy's load-step test 53 s -> ~20 s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv demo check test test-envs explore lint docs clean image dynamo-env live-model live-env live live-records test-live test-workers profile-roundtrip

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
	$(VENV)/bin/ruff check planner_core planner_cli flows tests infra docs migrations
	$(VENV)/bin/ruff format --check planner_core planner_cli flows tests infra docs migrations
	$(VENV)/bin/lint-imports
	$(VENV)/bin/hadolint Containerfile

# The planner's image (Containerfile: the wheel built in one stage, installed in the next; non-root; entrypoint
# `planner`), with podman, else docker (CONTAINER_ENGINE=... to choose); IMAGE names it. The Kustomize install
# (infra/base) runs llm-planner:<version>: push it where the cluster pulls from and set it there (docs/install.md).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= llm-planner:$(VERSION)
CONTAINER_ENGINE ?= $(shell command -v podman || command -v docker)
image:
	@test -n "$(CONTAINER_ENGINE)" || { echo "make image: no container engine: install podman or docker"; exit 1; }
	$(CONTAINER_ENGINE) build -f Containerfile -t $(IMAGE) .

# The quick loop before a commit: lint and the decision core's tests (tests/core: no Postgres, Prefect or
# subprocess server; tests/core/conftest.py fails the run if they import the runtime): 79 s on the idle 2-core
# machine (2026-12-07).
# `--dist load`: the core's tests are independent, so the workers share them test by test.
check: lint
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(CHECK_WORKERS) --dist load tests/core

# The documentation site, into site/; --strict turns every warning (a broken link, a missing page) into a failure.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

# The property tests with fresh random examples (`make test` uses a fixed set); a failure is kept in .hypothesis/.
explore: $(STAMP)
	PLANNER_HYPOTHESIS_PROFILE=explore $(VENV)/bin/python -m pytest -q -p no:cacheprovider $$(grep -rl --include="test_*.py" "@given" tests/core tests/runtime tests/lab tests/cli)

# The Dynamo comparison environment: Dynamo 1.6.1's own planner and mocker in a virtualenv of their own, for
# `planner bench --policies dynamo-1.6.1,...`, `python -m planner_core.lab.compare_mocker` and the Dynamo tests
# (found at .dynamo-venv/bin/python; $DYNAMO_PYTHON or --dynamo-python point elsewhere). ai-dynamo cannot go into
# .venv: it pins kubernetes<33 and pydantic<=2.13.5. Its wheel depends on AISimulate, which installs only from a
# vendor index, so it goes in without dependencies, after the pinned dependencies it really imports
# (planner_core/lab/dynamo/requirements.txt); the stand-in for AISimulate's module is in planner_core/lab/dynamo/stubs.
# Re-runs only when the version or the requirements change.
DYNAMO_VENV := .dynamo-venv
DYNAMO_VERSION := 1.6.1
DYNAMO_REQUIREMENTS := planner_core/lab/dynamo/requirements.txt
DYNAMO_STAMP := $(DYNAMO_VENV)/.installed-$(shell echo $(DYNAMO_VERSION) | cat - $(DYNAMO_REQUIREMENTS) | sha256sum | cut -c1-16)

$(DYNAMO_STAMP): $(DYNAMO_REQUIREMENTS)
	@test -x $(DYNAMO_VENV)/bin/python || $(PYTHON) -m venv $(DYNAMO_VENV)
	$(DYNAMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DYNAMO_VENV)/bin/python -m pip install -q --no-compile -r $(DYNAMO_REQUIREMENTS)
	@# last, so that pip does not list the wheels' requirements left out (aisimulate, ...) as conflicts
	$(DYNAMO_VENV)/bin/python -m pip install -q --no-compile --no-deps ai-dynamo==$(DYNAMO_VERSION) ai-dynamo-runtime==$(DYNAMO_VERSION)
	$(DYNAMO_VENV)/bin/python planner_core/lab/dynamo/run_planner.py --check
	@rm -f $(DYNAMO_VENV)/.installed-*
	@touch $@

dynamo-env: $(DYNAMO_STAMP)

# The live environment (`planner live`): aiperf 0.13 in a virtualenv of its own (its pins clash with ours), and the
# weightless model folder Dynamo's frontend and mocker serve, a small tokenizer trained locally with the
# `tokenizers` package aiperf brings (nothing is downloaded from a model hub).
AIPERF_VENV := .aiperf-venv
AIPERF_VERSION := 0.13.0
AIPERF_STAMP := $(AIPERF_VENV)/.installed-$(AIPERF_VERSION)
LIVE_MODEL := .planner/live-model

$(AIPERF_STAMP):
	@test -x $(AIPERF_VENV)/bin/python || $(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install -q --upgrade pip
	@# --no-compile: no .pyc compiled for all of transformers up front; what is imported compiles on first use
	$(AIPERF_VENV)/bin/python -m pip install -q --no-compile aiperf==$(AIPERF_VERSION)
	@rm -f $(AIPERF_VENV)/.installed-*
	@touch $@

$(LIVE_MODEL)/config.json: $(AIPERF_STAMP) planner_core/lab/dynamo/make_tiny_model.py
	$(AIPERF_VENV)/bin/python planner_core/lab/dynamo/make_tiny_model.py $(LIVE_MODEL)

live-model: $(LIVE_MODEL)/config.json

live-env: $(AIPERF_STAMP) $(LIVE_MODEL)/config.json
	@command -v prometheus >/dev/null || apt-get install -y -q prometheus

# The install's manifests are rendered with `kubectl kustomize` (tests/runtime/kustomize.py): kubectl must be on
# PATH (the tests fail, naming how to get it, without it).
# Three pytest workers (pytest-xdist) on the 2-core machine, a test file to each at a time (`--dist loadfile`: a
# file's module fixtures are made once): most tests wait on Postgres, Prefect or a subprocess (two workers kept the
# CPU 63 % busy, three 84 %: pytest 938 s -> 761 s on fresh clones, 2026-12-07). Each has its own Postgres server,
# Prefect server and temporary folders (tests/conftest.py). TEST_WORKERS=0 runs in one process.
# The live stack's tests (tests/runtime/test_live_stack.py: Dynamo's frontend and mocker engines) need the Dynamo
# environment and the model folder, built first (without them the tests fail, naming the make target).
# The three environments are built side by side (`-j3`; a few minutes saved on a fresh clone: pip mostly waits on
# downloads and the disk, and each environment is its own folder), then the linters and the docs, then pytest.
TEST_WORKERS ?= 3
# `make check`: the core's tests are CPU-bound (model fits, simulated runs): one worker per core.
CHECK_WORKERS ?= 2
test-envs:
	@$(MAKE) --no-print-directory -j3 $(STAMP) $(DYNAMO_STAMP) $(LIVE_MODEL)/config.json

test: test-envs
	@$(MAKE) --no-print-directory lint docs
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30  # the slowest tests named in every run: CI has a time limit

# The planner scaling Dynamo's frontend + prefill and decode mocker engines under aiperf replaying the Azure
# conversation hour (15 minutes, engines slowed 16 times), then the same traffic at the cheapest fixed size meeting
# 99 % (2p1d) and one prefill engine fewer (1p1d); prints the comparison and whether the SLA binds (the three
# environments built side by side first, as `make test` builds them; the runs about 18, 17 and 18 minutes;
# LIVE_ARGS: e.g. --record docs/results/live/NAME.json; --traffic code|mooncake|day, --fixed-search N, --mode agg).
live: test-envs live-env
	nice -n 5 $(VENV)/bin/planner live $(LIVE_ARGS)

# The live record (docs/results/live/, rendered in docs/operations.md): the conversation hour as `make live` runs it,
# then the code hour at its own frontier (4p1d, the cheapest pair meeting 99 % in our simulator on that traffic, and
# 3p1d; a GPU budget of 6 for the planner), each 15 minutes a run: about two hours.
LIVE_DATE := $(shell date -u +%Y-%m-%d)
live-records: test-envs live-env
	nice -n 5 $(VENV)/bin/planner live --out .planner/live-conv --record docs/results/live/$(LIVE_DATE)-conv-disagg.json
	nice -n 5 $(VENV)/bin/planner live --out .planner/live-code --traffic code --max-workers 6 \
		--fixed-size 4:1,3:1 --record docs/results/live/$(LIVE_DATE)-code-disagg.json

# The fleet on two real Prefect process workers (prefect.yaml's `fleet` deployment): a minute or two.
test-workers: $(STAMP)
	PLANNER_WORKER_TESTS=1 $(VENV)/bin/python -m pytest -q tests/runtime/test_fleet_workers.py

# The live stack's longer integration tests (a few minutes each: real frontend, engines, Prometheus), not in `make
# test`; with tests/runtime/test_live_stack.py, which `make test` runs too. test_live_disagg.py: the disaggregated
# stack, each pool scaled up and down by the planner, aiperf against the planner's view (7.5 min, 2026-12-07,
# on a saturated machine).
test-live: $(STAMP) $(DYNAMO_STAMP) live-env
	PLANNER_LIVE_TESTS=1 $(VENV)/bin/python -m pytest -q tests/runtime/test_live_stack.py tests/lab/test_profile_live.py tests/lab/test_live_route_proxy.py tests/lab/test_live_lifecycle.py tests/lab/test_live_disagg.py

# `planner profile` round trip: Dynamo's frontend + one mocker timed by the H200 profile, profiled over HTTP and
# compared with its source (~4 min); the record goes to docs/results/profile/ (rendered in perf-models.md).
PROFILE_RT := .planner/profile-roundtrip
profile-roundtrip: $(STAMP) $(DYNAMO_STAMP) live-env
	rm -rf $(PROFILE_RT)
	nice -n 5 $(VENV)/bin/planner profile --round-trip --out $(PROFILE_RT) $(PROFILE_ARGS)
	mkdir -p docs/results/profile
	cp $(PROFILE_RT)/roundtrip.json docs/results/profile/roundtrip.json

clean:
	-$(VENV)/bin/planner db stop
	rm -rf .planner site

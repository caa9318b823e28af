# Two entry points, each self-contained on a fresh machine and safe to repeat:
#   make demo   venv + install + Redis 8.6 (built once, cached) + the demo
#   make test   the same set-up + the whole test suite
# `make demo DEMO_ARGS=--no-spark` skips Spark; `make demo DEMO_ARGS='--url redis://HOST:PORT'`
# runs on an existing Redis >= 7.0 (then nothing is built). DEMO_ARGS takes any `lbs demo` option.
# Other targets: setup, redis, docs, wheel, bench, bench-fleet, proptest, faults, fuzz, typecheck, lint, matrix, clean.

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.lbs-installed
# Everything that changes what `pip install -e` builds.
SOURCES := pyproject.toml setup.py $(wildcard src/_lbscore/*.pyx src/_lbscore/*.pxd src/_lbscore/*.h) \
           $(wildcard plugins/*/pyproject.toml)
# The first-party plugins (each its own distribution), installed next to lbs.
PLUGINS := $(patsubst %/pyproject.toml,%,$(wildcard plugins/*/pyproject.toml))
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: demo test faults setup redis docs wheel bench bench-report bench-fleet proptest fuzz typecheck lint matrix clean

demo: setup
ifneq (,$(findstring -url,$(DEMO_ARGS)))
	$(PY) -m lbs demo $(DEMO_ARGS)
else
	@srv=$$(scripts/redis.sh) && LBS_REDIS_SERVER=$$srv $(PY) -m lbs demo $(DEMO_ARGS)
endif

# Lint first (seconds), then the suite (the dashboard's browser tests drive Debian's
# chromium, which scripts/chromium.sh finds or installs), the first-party plugins' tests, plus every
# benchmark once with timing off and on little work (bench.size, benchmarks/conftest.py) so none
# can rot, and the property tests in their short "smoke" profile (see conftest.py), under
# coverage: the report's last line
# is the total over lbs and the plugins, measured in the test process (the `lbs`
# processes the CLI tests start are not measured). The 25 slowest tests are listed at the end:
# the suite is kept under about 20 minutes.
test: setup lint
	@srv=$$(scripts/redis.sh) && srv7=$$(scripts/redis.sh --redis7) && vk=$$(VENV=$(VENV) scripts/valkey.sh) && chromium=$$(scripts/chromium.sh) && \
		LBS_REDIS_SERVER=$$srv LBS_REDIS7_SERVER=$$srv7 LBS_REQUIRE_REDIS7=1 LBS_VALKEY_SERVER=$$vk LBS_REQUIRE_VALKEY=1 LBS_CHROMIUM=$$chromium \
		LBS_HYPOTHESIS_PROFILE=$${LBS_HYPOTHESIS_PROFILE:-smoke} \
		$(PY) -m coverage run -m pytest tests $(addsuffix /tests,$(PLUGINS)) benchmarks --benchmark-disable --durations=25 $(PYTEST_ARGS)
	@$(PY) -m coverage report

# ruff's lint rules and its formatter (pyproject.toml [tool.ruff]) over everything
# Python in the repository; `.venv/bin/ruff format` and `ruff check --fix` repair most.
LINTED := src tests benchmarks plugins examples scripts conftest.py setup.py
lint: setup
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

# The unit suite on the oldest and newest supported Pythons (scripts/matrix.sh: each in
# its own .venv-pyX.Y, interpreters from PATH or pyenv, nothing downloaded). .ci/run runs it.
matrix:
	scripts/matrix.sh

# The fault suite (tests/faults) at full size: 10x the streams and durations
# of the smoke size `make test` runs, with each test's figures printed; every
# test on Redis 8.x and on Valkey (scripts/valkey.sh; `make test` runs a subset there).
faults: setup
	@srv=$$(scripts/redis.sh) && srv7=$$(scripts/redis.sh --redis7) && vk=$$(VENV=$(VENV) scripts/valkey.sh) && \
		LBS_REDIS_SERVER=$$srv LBS_REDIS7_SERVER=$$srv7 LBS_REQUIRE_REDIS7=1 LBS_VALKEY_SERVER=$$vk LBS_REQUIRE_VALKEY=1 LBS_FAULTS=full \
		$(PY) -m pytest tests/faults -s $(PYTEST_ARGS)

# The property tests with thousands of examples each (about 10 minutes).
proptest: setup
	LBS_HYPOTHESIS_PROFILE=thorough $(PY) -m pytest tests/unit $(PYTEST_ARGS)

# Ten minutes of the RESP reader's mutation fuzzer (tests/unit/_fuzz.py).
FUZZ_SECONDS ?= 600
fuzz: setup
	cd tests/unit && ../../$(PY) _fuzz.py --seconds $(FUZZ_SECONDS) --out ../../fuzz-findings

setup: $(STAMP)

# The first install downloads about 540 MB (pyspark alone 456 MB) and compiles the core: 1.5-8 min
# on 2 cores, measured with an empty pip cache beside nothing and beside a loaded machine (86 s, 484 s).
# pip's own lines show what it is doing (download bars included); the quick steps stay quiet.
$(STAMP): $(SOURCES)
	@test -x $(PY) || { echo "make setup: creating the virtualenv $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "make setup: installing into $(VENV) lbs (compiling its Cython core), its dependencies, the dev and docs tools" \
	      "and pyspark + pyarrow for the demo: about 540 MB to download and 1.5-8 min on 2 cores the first time," \
	      "less once pip's cache has them; pip shows its progress"
	$(PY) -m pip install --quiet --upgrade pip
	@# A venv made before the distribution was renamed lbs-streams still has "lbs".
	$(PY) -m pip uninstall --quiet --yes lbs 2>/dev/null || true
	$(PY) -m pip install --progress-bar on -e '.[dev,spark,docs]'
	@echo "make setup: installing the first-party plugins ($(notdir $(PLUGINS)))"
	$(PY) -m pip install --quiet --no-build-isolation $(addprefix -e ./,$(PLUGINS))
	@echo "make setup: done; $(VENV) is ready"
	@touch $@

redis:
	@scripts/redis.sh

# The documentation site (mkdocs.yml) into site/, warnings as errors. Material's banner
# about MkDocs 2.0 is no warning about these docs, hence NO_MKDOCS_2_WARNING.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# The sdist, the repaired manylinux wheel and the plugins' wheels, into dist/.
wheel: setup
	scripts/dist.sh --python $(PY) dist

# Every benchmark; the fleet rows alone (bench-fleet, below) take about 15 minutes of it on 2 cores.
bench: setup
	@srv=$$(scripts/redis.sh) && LBS_REDIS_SERVER=$$srv $(PY) -m pytest benchmarks --benchmark-disable-gc $(PYTEST_ARGS)

# The whole of benchmarks/ in one run, then every group's rows beside its baseline, with the ratio
# (what docs/benchmarks.md is written from).
bench-report: setup
	@srv=$$(scripts/redis.sh) && LBS_REDIS_SERVER=$$srv $(PY) -m pytest benchmarks --benchmark-disable-gc --benchmark-json=.bench.json $(PYTEST_ARGS)
	$(PY) -m benchmarks.report .bench.json

# The fleet benchmark alone (benchmarks/bench_fleet.py: K consumer processes of one service, 1, 2, 4
# and more where the cores allow, beside the plain loop and the Go client's commands), then its report
# (what docs/benchmarks.md's "Fleets" section is written from). LBS_FLEET_CONSUMERS=1,2 and
# LBS_FLEET_RATES=500,2000 choose the sizes; LBS_FLEET_SECONDS the window.
bench-fleet: setup
	@srv=$$(scripts/redis.sh) && LBS_REDIS_SERVER=$$srv $(PY) -m pytest benchmarks/bench_fleet.py --benchmark-disable-gc --benchmark-json=.bench-fleet.json $(PYTEST_ARGS)
	$(PY) -m benchmarks.report .bench-fleet.json

typecheck: setup
	$(PY) -m mypy
	@for p in $(PLUGINS); do (cd $$p && $(CURDIR)/$(PY) -m mypy) || exit 1; done

clean:
	rm -rf build dist site $(VENV) .venv-py3.* .coverage .coverage.* src/*.egg-info src/_lbscore/*.c src/_lbscore/*.so src/_lbscore/*.html
	rm -rf $(foreach p,$(PLUGINS),$(p)/build $(p)/src/*.egg-info)

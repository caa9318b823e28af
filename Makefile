# Two entry points, each self-contained on a fresh machine and safe to repeat:
#   make demo   venv + install + Redis 8.6 (built once, cached) + the demo
#   make test   the same set-up + the whole test suite
# Other targets: setup, redis, wheel, bench, proptest, faults, fuzz, typecheck, clean.

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

.PHONY: demo test faults setup redis wheel bench proptest fuzz typecheck clean

demo: setup
	@srv=$$(scripts/redis.sh) && LBS_REDIS_SERVER=$$srv $(PY) -m lbs demo

# The suite, the first-party plugins' tests, plus every benchmark once with
# timing off so none can rot, and the property tests in their short "smoke"
# profile (see conftest.py).
test: setup
	@srv=$$(scripts/redis.sh) && LBS_REDIS_SERVER=$$srv LBS_HYPOTHESIS_PROFILE=$${LBS_HYPOTHESIS_PROFILE:-smoke} \
		$(PY) -m pytest tests $(addsuffix /tests,$(PLUGINS)) benchmarks --benchmark-disable $(PYTEST_ARGS)

# The fault suite (tests/faults) at full size: 10x the streams and durations
# of the smoke size `make test` runs, with each test's figures printed.
faults: setup
	@srv=$$(scripts/redis.sh) && LBS_REDIS_SERVER=$$srv LBS_FAULTS=full \
		$(PY) -m pytest tests/faults -s $(PYTEST_ARGS)

# The property tests with thousands of examples each (about 10 minutes).
proptest: setup
	LBS_HYPOTHESIS_PROFILE=thorough $(PY) -m pytest tests/unit $(PYTEST_ARGS)

# Ten minutes of the RESP reader's mutation fuzzer (tests/unit/_fuzz.py).
FUZZ_SECONDS ?= 600
fuzz: setup
	cd tests/unit && ../../$(PY) _fuzz.py --seconds $(FUZZ_SECONDS) --out ../../fuzz-findings

setup: $(STAMP)

$(STAMP): $(SOURCES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# A venv made before the distribution was renamed lbs-streams still has "lbs".
	$(PY) -m pip uninstall --quiet --yes lbs 2>/dev/null || true
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	$(PY) -m pip install --quiet --no-build-isolation $(addprefix -e ./,$(PLUGINS))
	@touch $@

redis:
	@scripts/redis.sh

# The sdist, the repaired manylinux wheel and the plugins' wheels, into dist/.
wheel: setup
	scripts/dist.sh --python $(PY) dist

bench: setup
	@srv=$$(scripts/redis.sh) && LBS_REDIS_SERVER=$$srv $(PY) -m pytest benchmarks --benchmark-disable-gc $(PYTEST_ARGS)

typecheck: setup
	$(PY) -m mypy
	@for p in $(PLUGINS); do (cd $$p && $(CURDIR)/$(PY) -m mypy) || exit 1; done

clean:
	rm -rf build dist $(VENV) src/*.egg-info src/_lbscore/*.c src/_lbscore/*.so src/_lbscore/*.html
	rm -rf $(foreach p,$(PLUGINS),$(p)/build $(p)/src/*.egg-info)

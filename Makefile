# The two commands of the README:
#   make example   set up .venv and run the example job on the embedded default
#   make test      set up .venv and run the tests
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup example test bench

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,test,diagnose]'
	touch $@

example: setup
	$(VENV)/bin/trainwarden run examples/job.yaml

# tests/torch runs real torch.distributed jobs; where torch cannot be
# installed those tests skip, saying why.
$(VENV)/.torch: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[torch]' || echo "make: torch could not be installed; tests/torch will skip"
	touch $@

# Two workers (pytest-xdist; TEST_WORKERS=0 runs in this process): most
# tests wait on processes, brokers and clusters, not on the CPU. Those
# marked `alone` (they restart the shared broker, or bound seconds that a
# test beside them would stretch) run afterwards, by themselves. Exit 5
# (nothing collected, say with -k) counts as success.
TEST_WORKERS ?= 2
test: setup $(VENV)/.torch
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not alone"; first=$$?; \
	$(PY) -m pytest -q -p no:xdist -m alone; second=$$?; \
	for status in $$first $$second; do if [ $$status -ne 0 ] && [ $$status -ne 5 ]; then exit $$status; fi; done

bench: setup
	$(PY) bench/engine.py

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

test: setup $(VENV)/.torch
	$(PY) -m pytest -q; status=$$?; if [ $$status -eq 5 ]; then status=0; fi; exit $$status

bench: setup
	$(PY) bench/engine.py

# tpu-course: `make lab` to learn, `make test` to check everything (what CI runs).
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        ?= .venv
VENV_OLDEST ?= .venv-oldest
PY          := $(VENV)/bin/python
PY_OLDEST   := $(VENV_OLDEST)/bin/python
EXTRAS      ?= dev,aot

# Offline data: the reference MNIST files beside the checkout when they are there
# (CI), otherwise the loader downloads into its cache. Fashion-MNIST is also read from
# Debian's dataset-fashion-mnist package when it is installed.
SHARED_MNIST := $(abspath ../shared/data/mnist)
ifneq ($(wildcard $(SHARED_MNIST)),)
export TPU_COURSE_DATA ?= $(SHARED_MNIST)
endif
export PYTHONHASHSEED := 0

# Jupyter refuses to run as root (containers, many cloud VMs) without --allow-root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

NBVAL := --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=300

.PHONY: help setup setup-oldest lab test test-unit test-notebooks test-oldest labs sync notebooks bench doctor clean

help:
	@echo "make lab          set up (once) and start JupyterLab on the course"
	@echo "make test         unit tests, every notebook and solution under nbval, labs current,"
	@echo "                  then the unit tests again on the oldest supported JAX"
	@echo "make labs         rewrite labs/ from solutions/"
	@echo "make notebooks    re-execute every notebook and solution (commit the outputs)"
	@echo "make sync         rewrite setup cells and README's chapter table"
	@echo "make bench        run the benchmark suite into bench/results/"
	@echo "make doctor       print what the runtime is and what to fix"

setup: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml scripts/setup_venv.sh
	py=$$(scripts/find_python.sh) && scripts/setup_venv.sh $(VENV) "$$py" "$(EXTRAS)"
	@touch $@

setup-oldest: $(VENV_OLDEST)/.stamp
$(VENV_OLDEST)/.stamp: pyproject.toml scripts/setup_venv.sh ci/oldest.txt
	py=$$(PYTHON= scripts/find_python.sh 3.11) && scripts/setup_venv.sh $(VENV_OLDEST) "$$py" "dev,parity" ci/oldest.txt
	@touch $@

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=. $(ALLOW_ROOT) $(LAB_ARGS)

doctor: setup
	$(PY) -m tpu_course doctor

test: test-unit test-notebooks test-oldest

# Deprecation and future warnings fail the tests and the notebook kernels
# (tpu_course/warnings_policy.py; conftest.py sets the same for a bare pytest).
test-unit test-notebooks test-oldest: export TPU_COURSE_STRICT_WARNINGS := 1

test-unit: setup
	$(PY) -m pytest -q -ra tests tpu_course
	$(PY) -m tpu_course.notebooks check

test-notebooks: setup
	$(PY) -m pytest -q $(NBVAL) notebooks/*.ipynb solutions/*.ipynb

test-oldest: setup-oldest
	$(PY_OLDEST) -m pytest -q -ra tests tpu_course

labs: setup
	$(PY) -m tpu_course.notebooks labs

sync: setup
	$(PY) -m tpu_course.notebooks sync

notebooks: setup
	$(PY) -m tpu_course.notebooks build --all

bench: setup
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) $(VENV_OLDEST) .pytest_cache

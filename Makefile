# tpu-course: `make lab` to learn, `make test` to check everything (what CI runs).
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        ?= .venv
VENV_COLAB  ?= .venv-colab
PY          := $(VENV)/bin/python
PY_COLAB    := $(VENV_COLAB)/bin/python
EXTRAS      ?= dev,aot,docs

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

# Tests, notebooks and unsolved labs run JOBS at a time (pytest-xdist's -n; one kernel per
# notebook): `auto`, one per core, by default; JOBS=1 runs them one by one. Whole files
# go to a worker (--dist loadfile: a notebook's cells share one kernel). There is no
# schedule to keep: every test file stays within its CPU budget (conftest.py). A worker
# that crashes (a native abort) ends the run with its test named instead of being
# replaced: xdist can wait forever for the files a dead worker held.
JOBS   ?= auto
PYTEST := -q -ra -n $(JOBS) --dist loadfile --max-worker-restart=0

# A cell that runs 10 minutes has hung: nbval stops it and fails the notebook. That is a
# hang guard, not a budget (conftest.py reports each notebook against its budget).
CELL_TIMEOUT := --nbval-cell-timeout=600
NBVAL := --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg $(CELL_TIMEOUT)
CHAPTERS   := $(wildcard notebooks/*.ipynb)
SOLUTIONS  := $(wildcard solutions/*.ipynb)
UNIT       := tests tpu_course tools

# The Colab line: every chapter executed, its outputs compared loosely (--nbval-lax: a cell
# may not raise, its text may differ, since versions print differently), and the unit
# tests. Tests marked stack_independent (authoring tools, the grader's process handling,
# pure numpy models) ran on the newest line already, and so did those marked mistake (a
# typical mistake fed to a lab's checker: the hint it gets is the checker's logic) and
# built_on_newest (stored data built on the newest line, compared with it there). The
# solutions run on the newest line; here the unit tests grade honest answers written
# unlike the course's through each lab's checkers, and the unsolved labs run every other
# cell of theirs.
COLAB_TESTS := -m "not site and not stack_independent and not mistake and not built_on_newest" \
	--nbval-lax $(CELL_TIMEOUT) $(CHAPTERS) $(UNIT)

# The website from the committed notebooks (never executed here), warnings as errors,
# then its relative links checked offline (make site; make test runs it too).
# (The warnings policy is the course's, not Sphinx's: off for the build.)
define BUILD_SITE
rm -rf build/site
TPU_COURSE_STRICT_WARNINGS=0 $(PY) -m sphinx -W --keep-going -q -b html -c docs -d build/doctrees . build/site
$(PY) -m tools.linkcheck build/site
endef
# The site and decks (make site builds them into build/site/slides too) in headless
# Chromium, network blocked (screenshots: build/screenshots/).
SITE_TEST := $(PY) -m pytest -q -s -ra -m site tests/test_site.py

.PHONY: help setup setup-colab lab test test-newest test-unit test-notebooks test-labs test-colab test-site site slides labs sync notebooks bench doctor preflight clean

help:
	@echo "make lab          set up (once) and start JupyterLab on the course"
	@echo "make test         ruff, unit tests with every notebook and solution under nbval, every"
	@echo "                  unsolved lab to its scorecard, the site; then on Colab's own stack"
	@echo "                  (make -n test prints the commands)"
	@echo "make site         build the website into build/site (open build/site/index.html)"
	@echo "make slides       one reveal.js deck per chapter into build/slides (works offline)"
	@echo "make labs         rewrite labs/ from solutions/"
	@echo "make notebooks    re-execute every notebook and solution (commit the outputs)"
	@echo "make sync         rewrite setup cells and README's chapter table"
	@echo "make bench        run the benchmark suite into bench/results/"
	@echo "make doctor       print what the runtime is and what to fix"
	@echo "make preflight    run every chapter's core here, one row each (PREFLIGHT_ARGS=--json F)"

setup: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml scripts/setup_venv.sh
	py=$$(scripts/find_python.sh) && scripts/setup_venv.sh $(VENV) "$$py" "$(EXTRAS)"
	@touch $@

# Colab's own runtime (ci/colab.txt): Python 3.13, jax 0.7.2, flax 0.11.2, ipywidgets 7.7.1
# and the libtpu Colab ships (0.0.21.1, not the one jax 0.7.2 pins).
setup-colab: $(VENV_COLAB)/.stamp
$(VENV_COLAB)/.stamp: pyproject.toml scripts/setup_venv.sh ci/colab.txt
	py=$$(PYTHON= scripts/find_python.sh 3.13) && scripts/setup_venv.sh $(VENV_COLAB) "$$py" dev ci/colab.txt $$(grep '^libtpu==' ci/colab.txt)
	@touch $@

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=. $(ALLOW_ROOT) $(LAB_ARGS)

doctor: setup
	$(PY) -m tpu_course doctor

preflight: setup
	$(PY) -m tpu_course preflight $(PREFLIGHT_ARGS)

# Everything CI runs, one command after the other: the newest line (ruff; the unit tests
# and every notebook and solution in one pytest run; the unsolved labs to their
# scorecards; the site), then the same on Colab's own stack (ci/colab.txt).
test: test-newest test-colab

# Deprecation and future warnings fail the tests and the notebook kernels
# (tpu_course/warnings_policy.py; conftest.py sets the same for a bare pytest).
test-newest test-unit test-notebooks test-labs test-colab: export TPU_COURSE_STRICT_WARNINGS := 1

# One persistent JAX compilation cache per line: a program one test or notebook compiled
# is read back, not compiled again, by those that run it later (compiling is about half
# of a notebook's time on a CPU). (make clean empties build/jax-cache).
test-newest test-unit test-notebooks test-labs: export JAX_COMPILATION_CACHE_DIR := $(CURDIR)/build/jax-cache/newest
test-colab: export JAX_COMPILATION_CACHE_DIR := $(CURDIR)/build/jax-cache/colab
# Test files' CPU budgets are held on the newest line; on Colab's older jax they are reported.
test-colab: export TPU_COURSE_CPU_BUDGET := report
test-newest test-unit test-notebooks test-labs test-colab: export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS := 0.2

# The newest line. (`python -m tools.notebooks check`, the drift check, runs inside the
# unit tests: tests/test_notebooks.py.)
test-newest: setup
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST) $(NBVAL) $(CHAPTERS) $(SOLUTIONS) $(UNIT)
	$(PY) -m tools.notebooks run-labs --jobs $(JOBS)
	$(BUILD_SITE)
	$(SITE_TEST)

# Colab's line: its pytest run (COLAB_TESTS above), then the unsolved labs on its stack.
test-colab: setup-colab
	$(PY_COLAB) -m pytest $(PYTEST) $(COLAB_TESTS)
	$(PY_COLAB) -m tools.notebooks run-labs --jobs $(JOBS)

# Parts of the newest line on their own.
test-unit: setup
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST) $(UNIT)

test-notebooks: setup
	$(PY) -m pytest $(PYTEST) $(NBVAL) $(CHAPTERS) $(SOLUTIONS)

test-labs: setup
	$(PY) -m tools.notebooks run-labs --jobs $(JOBS)

site: setup
	$(BUILD_SITE)

test-site: site
	$(SITE_TEST)

# One deck per chapter: build/slides/NN_<chapter>.slides.html + _assets/ (copy the folder).
slides: setup
	$(PY) -m tools.slides build --out build/slides

labs: setup
	$(PY) -m tools.notebooks labs

sync: setup
	$(PY) -m tools.notebooks sync

notebooks: setup
	$(PY) -m tools.notebooks build --all

bench: setup
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) $(VENV_COLAB) .pytest_cache build/jax-cache

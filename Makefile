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

# Tests, notebooks and labs run JOBS at a time (pytest-xdist; one kernel per notebook):
# one more than the cores, since many tests and cells wait on subprocesses (the grader's
# sandbox, multi-host ranks, doctor probes, a killed training run). On 2 cores, three
# workers kept the CPU 148 % busy through the unit tests: 319 s against 347 s with two.
JOBS  ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
# Whole files to a worker, longest first (the order conftest.py's RUN_FIRST sets; xdist's
# default reorder, by number of items per file, would undo it).
XDIST := -n $(JOBS) --dist loadfile --no-loadscope-reorder
# Unsolved labs run at once (make test-labs). `make test` runs both lines' labs one at a
# time beside the Colab line's tests: three at a time each (nine busy processes on two
# cores with the tests) slowed chapter 8's cells there fourfold.
LAB_JOBS ?= $(JOBS)

# A cell that runs 10 minutes has hung: nbval stops it and fails the notebook. That is a
# hang guard, not a budget (conftest.py reports each notebook against its budget): with
# the labs running beside a line's tests, chapter 8's training cell once took over 5 of
# CI's minutes.
CELL_TIMEOUT := --nbval-cell-timeout=600
NBVAL := --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg $(CELL_TIMEOUT)
CHAPTERS   := $(wildcard notebooks/*.ipynb)
SOLUTIONS  := $(wildcard solutions/*.ipynb)
UNIT       := tests tpu_course tools

.PHONY: help setup setup-colab lab test test-newest test-unit test-notebooks test-labs test-colab test-site site slides labs sync notebooks bench doctor preflight clean

help:
	@echo "make lab          set up (once) and start JupyterLab on the course"
	@echo "make test         unit tests, every notebook and solution under nbval, every unsolved"
	@echo "                  lab run to its scorecard, then all of it again on Colab's own stack"
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

# The site's build (Sphinx: one process) and browser test mostly leave a core idle, so
# they run beside the newest line's tests; their output follows those in the log.
test:
	@mkdir -p build
	@$(MAKE) --no-print-directory test-site > build/test-site.log 2>&1 & site=$$!; \
	$(MAKE) --no-print-directory test-newest; newest=$$?; \
	wait $$site; status=$$?; \
	echo "make test-site (beside the newest line's tests):"; cat build/test-site.log; \
	[ $$newest -eq 0 ] && [ $$status -eq 0 ]
	@$(MAKE) --no-print-directory test-labs LAB_JOBS=1 > build/test-labs.log 2>&1 & labs=$$!; \
	$(MAKE) --no-print-directory test-colab LAB_JOBS=1; colab=$$?; \
	wait $$labs; status=$$?; \
	echo "make test-labs (beside the Colab line):"; cat build/test-labs.log; \
	[ $$colab -eq 0 ] && [ $$status -eq 0 ]

# Deprecation and future warnings fail the tests and the notebook kernels
# (tpu_course/warnings_policy.py; conftest.py sets the same for a bare pytest).
test-newest test-unit test-notebooks test-labs test-colab: export TPU_COURSE_STRICT_WARNINGS := 1

# One persistent JAX compilation cache per line: a program one test or notebook compiled
# is read back, not compiled again, by those that run it later (compiling is about half
# of a notebook's time on a CPU). (make clean empties build/jax-cache).
test-newest test-unit test-notebooks test-labs: export JAX_COMPILATION_CACHE_DIR := $(CURDIR)/build/jax-cache/newest
test-colab: export JAX_COMPILATION_CACHE_DIR := $(CURDIR)/build/jax-cache/colab
test-newest test-unit test-notebooks test-labs test-colab: export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS := 0.2

# The newest line: the unit tests and the notebooks in one pytest run, the longest
# files (notebooks and test files alike) handed out first and the short ones filling the
# workers (run one after the other, the last notebook ran alone on a half-idle machine
# for minutes).
# test-unit and test-notebooks run the two halves alone. (`python -m tools.notebooks
# check`, the drift check, runs inside the unit tests: tests/test_notebooks.py.)
test-newest: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q -ra $(XDIST) $(NBVAL) $(CHAPTERS) $(SOLUTIONS) $(UNIT)

test-unit: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q -ra $(XDIST) $(UNIT)

test-notebooks: setup
	$(PY) -m pytest -q $(XDIST) $(NBVAL) $(CHAPTERS) $(SOLUTIONS)

test-labs: setup
	$(PY) -m tools.notebooks run-labs --jobs $(LAB_JOBS)

# The Colab line: every chapter executed and the unit tests, in one pytest run as on the
# newest line; the chapters' outputs are compared loosely (--nbval-lax: a cell may not
# raise, its text may differ, since versions print differently); beside that run, the
# unsolved labs to their scorecards (their kernels fill what the tests leave idle; so do
# the newest line's labs, which `make test` runs beside this). Tests marked
# stack_independent (authoring tools, the grader's process handling, pure numpy models)
# ran on the newest line already, and so did those marked mistake (a typical mistake fed
# to a lab's checker: the hint it gets is the checker's logic). The solutions run on the
# newest line; here the unit tests grade honest answers written unlike the course's
# through each lab's checkers, and the unsolved labs run every other cell of theirs.
COLAB_TESTS := -m "not site and not stack_independent and not mistake" \
	--nbval-lax $(CELL_TIMEOUT) $(CHAPTERS) $(UNIT)
test-colab: setup-colab
	@mkdir -p build
	@$(PY_COLAB) -m tools.notebooks run-labs --jobs $(LAB_JOBS) > build/test-colab-labs.log 2>&1 & labs=$$!; \
	echo '$(PY_COLAB) -m pytest -q -ra $(XDIST) $(COLAB_TESTS)'; \
	$(PY_COLAB) -m pytest -q -ra $(XDIST) $(COLAB_TESTS); tests=$$?; \
	wait $$labs; status=$$?; \
	echo "run-labs on Colab's stack (beside its tests):"; cat build/test-colab-labs.log; \
	[ $$tests -eq 0 ] && [ $$status -eq 0 ]

# The website from the committed notebooks (never executed here), warnings as errors,
# then its relative links checked offline.
site: setup
	rm -rf build/site
	$(PY) -m sphinx -W --keep-going -q -b html -c docs -d build/doctrees . build/site
	$(PY) -m tools.linkcheck build/site

# One deck per chapter: build/slides/NN_<chapter>.slides.html + _assets/ (copy the folder).
slides: setup
	$(PY) -m tools.slides build --out build/slides

# Site and decks (make site builds them into build/site/slides too) in headless Chromium,
# network blocked (screenshots: build/screenshots/).
test-site: site
	$(PY) -m pytest -q -s -ra -m site tests/test_site.py

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

# plexgt: two commands on a fresh machine.
#   make demo   create .venv, install, run the main job on an embedded default
#   make test   create .venv, install, run the whole suite (serial and multi-rank)
#
# Knobs (make VAR=value):
#   PYTHON      interpreter that creates the venv            (python3.11, else python3)
#   TORCH_SPEC  the torch to install; a site torch is kept    (torch==2.13.0, a CPU build here)
#   MPI         wheel: the MPICH wheel from PyPI | system: build mpi4py against your mpicc
#   MPI_SIZES   rank counts the multi-rank suite runs under   (1 3 4 6 8)

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
MPI ?= wheel
MPI_SIZES ?= 1 3 4 6 8
PY := $(VENV)/bin/python
MPIEXEC ?= $(VENV)/bin/mpiexec
# each rank's report of the multi-rank suite (rank 0's is the terminal) and, after a hang, its
# stacks (*.hang), which a failed run prints
MPI_LOGS ?= out/mpi-logs
export OMP_NUM_THREADS ?= 1

.PHONY: install demo test lint clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH_SPEC)"
ifeq ($(MPI),wheel)
	$(PY) -m pip install "mpich>=4.2" "mpi4py>=4.0"
else
	$(PY) -m pip install --no-binary mpi4py "mpi4py>=4.0"
endif
	$(PY) -m pip install -e ".[test,pyg]"
	$(PY) -c "import sys, plexgt.ops.native as n; sys.exit(n.main())"
	touch $@

DEMO_DIR ?= out/demo-sbm

# The main job on an embedded default: an SBM graph (50K nodes, 1M edges) prepared, then a
# full-graph training run with the grid and strategy chosen by the planner, on DEMO_RANKS
# ranks: 2, the fastest scale `plexgt plan --data out/demo-sbm --config
# jobscripts/configs/demo.toml --world-size 4` finds on a 2-core host (its quick calibration;
# perf/results/plan_calibration.md, where 1 rank measured 1.2x faster still); on another host
# run that plan and set DEMO_RANKS to its "fastest at any scale".
DEMO_RANKS ?= 2
demo: install
	$(VENV)/bin/plexgt prep --format sbm --nodes 50000 --edges 1000000 --out $(DEMO_DIR) \
		--overwrite --quiet
	$(MPIEXEC) -n $(DEMO_RANKS) $(VENV)/bin/plexgt train --config jobscripts/configs/demo.toml \
		--data $(DEMO_DIR) --metrics out/demo-metrics.jsonl

lint: install
	$(VENV)/bin/ruff check .
	$(PY) tools/check_ruff_files.py $(VENV)/bin/ruff
	$(VENV)/bin/lint-imports

# The job-launching tests (integration, Slurm) spend much of their time waiting (timeouts,
# Slurm's scheduler, process start-up), so they run two at a time, spread test by test except
# the Slurm ones (on one worker, so the local Slurm cluster starts once: tests/conftest.py's
# scheduler, which --dist loadgroup selects): --dist loadfile kept test_train.py, about 550 s
# of tests, on one worker.
test: install lint
	$(PY) -m pytest -q -p no:cacheprovider --durations=8 -n 2 tests/unit tests/data
	$(PY) -m pytest -q -p no:cacheprovider --durations=8 -n 2 --dist loadgroup \
		tests/integration tests/slurm
	@mkdir -p $(MPI_LOGS)
	@for n in $(MPI_SIZES); do \
		echo "== multi-rank suite on $$n ranks"; \
		PLEXGT_TEST_LOGDIR=$(MPI_LOGS) PLEXGT_TEST_DEADLINE=$$(( $$(date +%s) + 900 )) \
		timeout 900 $(MPIEXEC) -n $$n $(PY) -m mpi4py -m pytest \
			-q -p no:cacheprovider --durations=5 -o timeout_method=thread tests/mpi || { \
			for f in $(MPI_LOGS)/plexgt-mpi-n$$n-rank*.hang; do \
				if [ -s $$f ]; then echo "== stacks of a hung rank: $$f"; cat $$f; fi; \
			done; exit 1; }; \
	done

clean:
	rm -rf $(VENV) build *.egg-info

# Every target sets itself up on a fresh machine: the venv, torch (the CPU build on local disk,
# installed first so nothing pulls a CUDA build), DeepSpeed (built against that torch), hpctrain.
# Every version comes from hpctrain/kernel/support.py (MAIN here, LANE for the compatibility lane).
SUPPORT := python3 hpctrain/kernel/support.py
PY      ?= python$(shell $(SUPPORT) main python)
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
PYTEST  := $(BIN)/python -m pytest
export OMP_NUM_THREADS ?= 1
export DS_ACCELERATOR ?= cpu
export DS_BUILD_OPS ?= 0

.PHONY: venv venv-compat test-compat sysdeps demo lint golden docs test test-fast test-slurm cluster-up cluster-down bench bench-quick gpu-check wheel clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q torch==$(shell $(SUPPORT) main torch)
	$(BIN)/pip install -q --no-build-isolation deepspeed==$(shell $(SUPPORT) main deepspeed)
	$(BIN)/pip install -q -e '.[test,deepspeed]'
	touch $@

# The compatibility lane (issue 21): the oldest supported torch and DeepSpeed on the newest supported
# Python (support.py LANE) in a venv of its own, running the tests that touch torch's API under it:
# checkpoints (save, load, resume, resharding, a failed save, the format), the strategies through
# exact resume, the runtime API, and a checkpoint crossing between its torch and the main venv's,
# both ways. Its torch is a CUDA build from PyPI (it runs on the CPU): ~3.3 GB of wheels the first
# time, then pip's cache.
LANE_VENV  := .venv-compat
LANE_STAMP := $(LANE_VENV)/.installed-stamp
LANE_PYVER  = $(shell $(SUPPORT) lane python)
LANE_PY    ?= $(or $(shell p="$$(pyenv prefix $(LANE_PYVER) 2>/dev/null)/bin/python$(LANE_PYVER)"; \
                [ -x "$$p" ] && echo "$$p"),$(shell command -v python$(LANE_PYVER)))
# What `make test` runs in the lane (each seen passing there): of these files, every test that is
# not `slow`, and the slow ones marked `lane` (the essential cases: CI's time; `make test-compat
# LANE_MARKS=` runs them all).
LANE_TESTS ?= tests/test_support.py tests/test_ckpt_writer.py tests/test_checkpoint.py \
              tests/test_faults.py tests/test_runtime.py tests/test_resume_exact.py \
              tests/test_export.py tests/test_export_mesh.py tests/test_compat.py \
              tests/test_random_kills.py tests/test_resize.py
LANE_MARKS ?= not slow or lane

venv-compat: $(LANE_STAMP)

$(LANE_STAMP): pyproject.toml hpctrain/kernel/support.py
	@test -n "$(LANE_PY)" || { echo "the compatibility lane needs python$(LANE_PYVER): pyenv install \
	$(LANE_PYVER), or make LANE_PY=/path/to/python$(LANE_PYVER)"; exit 2; }
	test -x $(LANE_VENV)/bin/python || $(LANE_PY) -m venv $(LANE_VENV)
	$(LANE_VENV)/bin/pip install -q --upgrade pip setuptools wheel
	$(LANE_VENV)/bin/pip install -q torch==$(shell $(SUPPORT) lane torch)
	$(LANE_VENV)/bin/pip install -q --no-build-isolation deepspeed==$(shell $(SUPPORT) lane deepspeed)
	$(LANE_VENV)/bin/pip install -q -e '.[deepspeed]' 'pytest>=8' 'pytest-timeout>=2.3'
	touch $@

# The lane's tests under its torch (the `compat` ones against the main venv's torch too).
test-compat: $(LANE_STAMP) $(STAMP)
	@start=$$(date +%s); $(LANE_VENV)/bin/python -m pytest -q -x --durations=10 \
	$(if $(LANE_MARKS),-m "$(LANE_MARKS)") $(LANE_TESTS); \
	rc=$$?; echo "compatibility lane (torch $$($(SUPPORT) lane torch)): $$(( $$(date +%s) - start )) s"; \
	exit $$rc

# System packages the tests need besides the venv: shellcheck lints every rendered script; a real
# OpenSSH server and client (and rsync) front the live cluster for the remote tests (tests/ssh/).
SYSPKGS := shellcheck openssh-server openssh-client rsync
sysdeps:
	@missing=; for p in $(SYSPKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing$$missing"; apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

# The local default end to end with the real train_entry. A re-run moves a COMPLETED runs/demo aside
# to runs/demo.old-<time> (--replace-finished); an unfinished one is refused with a resume hint.
# It ends with the report: loss from ~2.8 to ~2.0, and the PNG plots it wrote (runs/demo/report/).
demo: $(STAMP)
	$(BIN)/hpctrain submit --profile local --name demo --nodes 2 --gpus 1 --wait --replace-finished -- --max-steps 60
	$(BIN)/hpctrain report demo

# ruff format --check, ruff check (rules in pyproject.toml), mypy --strict on the typed layers.
LINT_PATHS ?= .
lint: $(STAMP)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy

# Rewrite the golden scripts after an intended template change (say so in the commit message).
golden: $(STAMP)
	HPCTRAIN_UPDATE_GOLDEN=1 $(PYTEST) -q tests/test_render.py tests/test_spares.py tests/test_bad_nodes.py -k golden

# The generated documents: contract tables in docs/design.md, the profile key reference.
docs: $(STAMP)
	$(BIN)/python -m hpctrain.kernel.docs docs/design.md
	$(BIN)/python -m hpctrain.profiles.docs --design docs/design.md
	$(BIN)/python -m hpctrain.profiles.docs > docs/site-profiles.md

# The live Slurm tests need root (CI runs as root). The cluster is stopped whatever happens.
# Three streams at once: lint (its output in .lint.log) and the compatibility lane (its venv's
# install, then its tests under the oldest supported torch; output in .test-compat.log), both
# printed at the end, beside every test here on two pytest-xdist workers, the live tests in order
# on one (they share the cluster's two nodes), the rest beside them (tests/conftest.py). So the
# live suite always runs with both cores busy, as on a shared CI machine. Lint and the lane's
# install ran before the tests until session 12 (50 + 85 s with a warm pip cache); beside them
# they end long before the main suite (the lane ~13 min, the suite ~25).
# TEST_LOG: one line per test as it ends (outcome, seconds, id).
TEST_LOG ?= $(CURDIR)/.test-times.log
test: $(STAMP) sysdeps
	bash tests/slurm/cluster.sh up --optional
	@$(MAKE) --no-print-directory lint >.lint.log 2>&1 & lint=$$!; \
	$(MAKE) --no-print-directory test-compat >.test-compat.log 2>&1 & lane=$$!; \
	rm -f $(TEST_LOG); HPCTRAIN_TEST_LOG=$(TEST_LOG) $(PYTEST) -q -x -n 2 --durations=25 \
	  -m "not compat and not lane_only" tests; rc=$$?; bash tests/slurm/cluster.sh down; \
	wait $$lint; lint_rc=$$?; echo "--- lint (exit $$lint_rc):"; tail -n 30 .lint.log; \
	wait $$lane; lane_rc=$$?; echo "--- the compatibility lane (exit $$lane_rc):"; \
	tail -n 40 .test-compat.log; [ $$rc -eq 0 ] && [ $$lint_rc -eq 0 ] && [ $$lane_rc -eq 0 ]

test-fast: $(STAMP) sysdeps
	$(PYTEST) -q -m "not slurm and not slow and not compat" tests

test-slurm: $(STAMP)
	bash tests/slurm/cluster.sh up
	$(PYTEST) -q -m "slurm and not compat" --durations=0 tests; rc=$$?; bash tests/slurm/cluster.sh down; exit $$rc

cluster-up:
	bash tests/slurm/cluster.sh up

cluster-down:
	bash tests/slurm/cluster.sh down

# Every benchmark, full repetitions: `benchmarks/run.py --list` gives each group's planned seconds
# on a quiet 2-core machine; the results' Markdown gives each group's wall time beside its plan.
bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

# The same rows with fewer repetitions (for iterating; spreads wider, verdicts less often settled).
bench-quick: $(STAMP)
	$(BIN)/python benchmarks/run.py --quick

# On a machine with an NVIDIA GPU (and a CUDA build of torch): DDP, FSDP2+CPU offload, ZeRO-2/3 on
# NCCL, MFU, plan vs peak memory, doctor's NCCL sweep, preempt+resume; <= 5 min, one JSON file
# (docs/gpu-check.md). Without a GPU it checks its plan and exits 77, running nothing.
gpu-check: $(STAMP)
	DS_ACCELERATOR=cuda $(BIN)/python benchmarks/gpu_check.py --out gpu-check.json

wheel: $(STAMP)
	$(BIN)/python -m build --wheel --no-isolation --outdir dist .

clean:
	rm -rf $(VENV) $(LANE_VENV) dist build runs .pytest_cache

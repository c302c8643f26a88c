# Every target sets itself up on a fresh machine: the venv, torch (the CPU build on local disk,
# installed first so nothing pulls a CUDA build), DeepSpeed (built against that torch), hpctrain.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
PYTEST  := $(BIN)/python -m pytest
export OMP_NUM_THREADS ?= 1
export DS_ACCELERATOR ?= cpu
export DS_BUILD_OPS ?= 0

.PHONY: venv sysdeps demo lint golden docs test test-fast test-slurm cluster-up cluster-down bench bench-quick gpu-check wheel clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-build-isolation 'deepspeed==0.19.8'
	$(BIN)/pip install -q -e '.[test,deepspeed]'
	touch $@

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
	HPCTRAIN_UPDATE_GOLDEN=1 $(PYTEST) -q tests/test_render.py -k golden

# The generated documents: contract tables in docs/design.md, the profile key reference.
docs: $(STAMP)
	$(BIN)/python -m hpctrain.kernel.docs docs/design.md
	$(BIN)/python -m hpctrain.profiles.docs > docs/site-profiles.md

# The live Slurm tests need root (CI runs as root). The cluster is stopped whatever happens.
test: $(STAMP) sysdeps lint
	bash tests/slurm/cluster.sh up --optional
	$(PYTEST) -q -x --durations=15 tests; rc=$$?; bash tests/slurm/cluster.sh down; exit $$rc

test-fast: $(STAMP) sysdeps
	$(PYTEST) -q -m "not slurm and not slow" tests

test-slurm: $(STAMP)
	bash tests/slurm/cluster.sh up
	$(PYTEST) -q -m slurm --durations=0 tests; rc=$$?; bash tests/slurm/cluster.sh down; exit $$rc

cluster-up:
	bash tests/slurm/cluster.sh up

cluster-down:
	bash tests/slurm/cluster.sh down

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

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
	rm -rf $(VENV) dist build runs .pytest_cache

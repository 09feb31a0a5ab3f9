# lioncub: `make help` lists the targets.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
PYTEST_ARGS ?=
# Modules whose import proves the environment is complete; `install` is a no-op when they all import.
CHECK_IMPORTS = torch, torchvision, numpy, hydra, omegaconf, timm, tiktoken, datasets, pyarrow, tqdm, matplotlib, pandas, psutil, wandb, pytest, submitit, hydra_plugins.hydra_submitit_launcher, nbclient, nbformat, ipykernel

.DEFAULT_GOAL := help
.PHONY: help install test test-slow test-all bench-core

help:  ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' \
	  '{n[NR] = $$1; d[NR] = $$2; if (length($$1) > w) w = length($$1)} \
	   END {for (i = 1; i <= NR; i++) printf ("  make %-" w "s  %s\n"), n[i], d[i]}'

install:  ## install what is missing (torch 2.14.1 from local disk, the rest from PyPI)
	@$(PYTHON) -c "import $(CHECK_IMPORTS)" 2>/dev/null && $(PYTHON) -c "import importlib.util as u, sys; sys.exit(u.find_spec('whisper') is None)" \
	  && echo "install: every dependency is present" \
	  || { $(PIP) install -r requirements.txt && $(PIP) install --no-deps "openai-whisper==20250625"; }

test: install slurm-install  ## run the test suite (excludes tests marked slow; under 15 minutes on 2 cores)
	$(PYTHON) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: install slurm-install  ## run the tests marked slow (.ci/run runs them after `make test`)
	$(PYTHON) -m pytest -m slow $(PYTEST_ARGS)

test-all: install slurm-install  ## run every test, slow ones included
	$(PYTHON) -m pytest $(PYTEST_ARGS)

bench-core: install  ## pack/unpack and quantize throughput beside memcpy, and wire bytes per reducer
	$(PYTHON) -m src.bench.core_throughput

.PHONY: demo
demo: install laptop-data  ## 2 CPU processes on the paper-equivalent link (root; else loopback): Lion 32-bit vs Lion Cub 8/4/1-bit on the laptop scale model; figures, timing, speedups
	OMP_NUM_THREADS=1 $(PYTHON) -m src.demo $(DEMO_ARGS)

.PHONY: laptop-data
laptop-data: install  ## the laptop corpus (docstrings of CPython and PyTorch, compact vocabulary) in data/laptop_text, offline
	$(PYTHON) -m src.data.laptop_corpus --out data/laptop_text

.PHONY: bench
bench: install  ## communication benchmark on an emulated 2-host x 2-rank Ethernet cluster, 1 Gbit/s and unlimited (root)
	$(PYTHON) -m src.bench.comm_suite --out results/bench/comm

.PHONY: table-a1
table-a1: install laptop-data  ## Table A.1 / Fig. 10 analogue: GPT-2++ 38.7M on the emulated 2x2 cluster, paper-equivalent Ethernet and InfiniBand links (root); then the node hierarchy's rows (cub4_node, lion32_hsdp beside cub4 and lion32; 2 models, clip 0 and 1.0, 3 repeats)
	$(PYTHON) -m src.data.demo_corpus --out data/demo_text
	$(PYTHON) -m experiments.table_a1 --out results/table_a1
	$(PYTHON) -m experiments.table_a1 --node --out results/table_a1/node

# A real Slurm on this machine (slurm/local.py): 2 nodes, each a slurmd in its own network namespace of the emulated
# 1 Gbit/s Ethernet cluster. `source $(SLURM_DIR)/env.sh` points sbatch, squeue, ... and slurm.submit at it.
SLURM_DIR ?= /tmp/lioncub-slurm
.PHONY: slurm-install slurm-up slurm-down
slurm-install:  ## Debian's slurmctld, slurmd, slurm-client, munge for the local Slurm (root + apt-get; else says why)
	@$(PYTHON) -m slurm.local install || echo "slurm-install: not installed; the local-Slurm tests will be skipped"

slurm-up: install slurm-install  ## start a local 2-node Slurm in SLURM_DIR=/tmp/lioncub-slurm (root); then source its env.sh
	$(PYTHON) -m slurm.local up --dir $(SLURM_DIR)

slurm-down:  ## stop the local Slurm: daemons, jobs, namespaces; removes SLURM_DIR
	$(PYTHON) -m slurm.local down --dir $(SLURM_DIR)

.PHONY: figures
RUNS ?= results/runs
FIGURES_OUT ?= results/figures
figures: install  ## every figure and table of the paper at laptop scale over seeds (FIGS=table2,fig5 picks some; SEEDS=1 the quick pass): runs, results/figures/index.md
	$(PYTHON) -m experiments.figures --runs $(RUNS) --out $(FIGURES_OUT) $(if $(FIGS),--figs $(FIGS),) $(if $(SEEDS),--seeds $(SEEDS),) $(FIGURES_ARGS)

.PHONY: notebook
NOTEBOOK_OUT ?= results/notebook/figures.ipynb
notebook: install  ## run notebooks/figures.ipynb (verdicts, DataFrames, every figure) and save the executed copy in NOTEBOOK_OUT
	$(PYTHON) -m experiments.notebook --out $(NOTEBOOK_OUT) --runs $(RUNS)

.PHONY: table-a1-baselines
table-a1-baselines: install  ## as table-a1 for Lion 32-bit, Lion Cub 4-bit and the baselines (DDP, AdamW, 1-bit Adam, BitDP, D-Lion)
	$(PYTHON) -m experiments.table_a1 --out results/table_a1_baselines --variants lion32 ddp_lion cub4 --with-baselines

.PHONY: baselines
baselines: install  ## loss vs step/time and bytes per step: Lion 32-bit, Lion Cub 4-bit, 1-bit Adam, BitDP 2-bit, DDP AdamW (emulated 1 Gbit/s, root)
	$(PYTHON) -m experiments.baselines --out results/baselines

# The GPU check (docs/gpu.md). `gpu-check` and `gpu-bench` need no network: they do not run `install` (on the GPU
# machine the non-torch dependencies come from the wheels of `gpu-wheels`, made beforehand on a machine with network
# access). GPU_CHECK_ARGS / GPU_BENCH_ARGS pass options (e.g. --budget-s, --reuse DIR/report.json, --only SECTION).
GPU_CHECK_OUT ?= results/gpu_check
GPU_BENCH_OUT ?= results/gpu_bench
GPU_CHECK_ARGS ?=
GPU_BENCH_ARGS ?=
GPU_SESSION_OUT ?= $(if $(OUT),$(OUT),results/gpu_session)
# gpu-wheels' defaults (folder .whl, Python 3.12, manylinux x86_64 tags) live in src/bench/gpu_check/wheels.py; set
# GPU_WHEELS=DIR, PY_VERSION=3.11 or PLATFORM="tag ..." to override them.
GPU_WHEELS ?=
PY_VERSION ?=
PLATFORM ?=
.PHONY: gpu-check gpu-bench gpu-session gpu-wheels
gpu-check:  ## on a CUDA machine: steps, codecs, reducers on NCCL, training, syncs, fwd/bwd, memory, goals, Table A.1 projected -> GPU_CHECK_OUT/report.md (10 min on an H100; exit 3: no CUDA)
	$(PYTHON) -m src.bench.gpu_check --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

gpu-bench:  ## on a CUDA machine, at most 3 min: optimizer steps per variant (no-op and one-rank NCCL), peers, launches, host time, goals -> GPU_BENCH_OUT/report.md
	$(PYTHON) -m src.bench.gpu_check --suite bench --out $(GPU_BENCH_OUT) $(GPU_BENCH_ARGS)

gpu-session:  ## one call on a lent GPU machine (10 min): install .whl/, gpu-bench, gpu-check; reports and logs into GPU_SESSION_OUT (default: the environment's OUT)
	$(PYTHON) -m src.bench.gpu_check.session --out $(GPU_SESSION_OUT)

gpu-wheels:  ## wheels of the non-torch dependencies the GPU image lacks (for Python 3.12, manylinux x86_64) into .whl/
	$(PYTHON) -m src.bench.gpu_check.wheels $(if $(GPU_WHEELS),--out $(GPU_WHEELS),) \
	  $(if $(PY_VERSION),--python-version $(PY_VERSION),) $(foreach p,$(PLATFORM),--platform $(p))

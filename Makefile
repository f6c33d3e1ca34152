# reproflow: `make demo` reproduces every family's small suites here; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RESULTS ?= results
REPORTS ?= reports
LOGS ?= logs
# A folder of the papers' published results (e.g. Aceso's results/ref CSVs under aceso/reference-results/),
# drawn beside the reproduced figures; empty: the claims table still cites the papers' numbers.
REFERENCE ?=
EXECUTOR ?= local
# With EXECUTOR=slurm: the squash file every step's jobs run in through Pyxis (empty: the hosts' .venv).
IMAGE ?=
# With EXECUTOR=slurm: more of the jobs' options, as `reproflow submit` takes them, for every step's jobs
# (e.g. SUBMIT="--partition p5 --runtime oci --exclude node7").
SUBMIT ?=
EXTRAS := test,megatron,deepspeed,mpi
# Where make test puts the CPU image it builds (containers/build.sh cpu), its sidecars and its unpacked copy.
IMAGES ?= .local-images
# make demo ONLY=comms,fig8: only these targets (below), then the report and where things are.
ONLY ?=
REPRODUCE = $(BIN)/reproflow reproduce --executor $(EXECUTOR) --results $(RESULTS) --reports $(REPORTS) \
	--logs $(LOGS) $(if $(REFERENCE),--reference $(REFERENCE)) $(if $(IMAGE),--image $(IMAGE)) $(SUBMIT)
# One target per paper figure or table (workflows/reproduce/targets.toml): each runs only its steps.
FIGURES := comms compute-gemm resharding-1-to-m resharding-n-to-m cfp-search fig7 fig8 fig9 spatial-check \
	spatial-throughput spatial-chart cfp-crossover aceso-large

.PHONY: help venv lock demo reproduce archive test test-setup test-fast faults clean-room cluster-reproduce lint figures claims-doc docs sbatch bench bench-gpu containers gpu-image-here clean $(FIGURES)

help:
	@echo "make demo     set up .venv and run make reproduce here: every family's small suites, tables, figures,"
	@echo "              the report page and the claims; then print where everything is (ONLY=comms,fig8: those targets)"
	@echo "make reproduce  every family's small suites here (EXECUTOR=slurm IMAGE=<squash file>: on Slurm through Pyxis,"
	@echo "              after reproflow doctor; a rerun submits only what is not measured), then $(REPORTS)/report.html"
	@echo "              (self-contained) and report.md with every table, figure and claim; about 27 minutes on 2 cores"
	@echo "make <figure> one paper figure or table, only its experiments: $(FIGURES)"
	@echo "              (aceso-large: the large and scale search steps on the artifact's database, REFERENCE=<folder>"
	@echo "              holding aceso/profiled-time-eurosys and aceso/reference-results; not part of make demo)"
	@echo "make archive  reproflow-archive.tar.gz: suites, sbatch scripts, results, logs, report"
	@echo "make test     set up .venv, run ruff, build Enroot, Pyxis and the CPU image, start a local 2-node Slurm"
	@echo "              with Pyxis, run the tests, stop it"
	@echo "make test-fast  the inner loop: ruff and the tests that need no Slurm, no image and no long run"
	@echo "make clean-room  make test and a short make demo, each in a fresh Debian root filesystem with a clean"
	@echo "              clone of the current commit (root; under an hour); CLEAN_ROOM='test demo-full' to choose"
	@echo "make cluster-reproduce  the whole reproduction on the test cluster as on a real one: the CPU image, five"
	@echo "              shaped nodes, make reproduce EXECUTOR=slurm through Pyxis, compare with make demo's run"
	@echo "make faults   the fault-injection suite against a local 2-node Slurm: kills, hangs, a node down, time limit,"
	@echo "              cancel, 20 concurrent jobs, images Pyxis cannot start, 1000+ generated bad inputs; prints"
	@echo "              N faults injected, N survived"
	@echo "make figures  tables and figures from $(RESULTS)/ into $(REPORTS)/"
	@echo "make claims-doc  docs/claims.md from the code: every claim as declared, and its design's error rates"
	@echo "              simulated through the judge (about a minute)"
	@echo "make docs     rewrite the figures the docs quote from runs, from the runs recorded in docs/recorded/"
	@echo "make sbatch   re-render sbatch/*.sbatch from templates/ and workflows/"
	@echo "make lock     re-resolve every Python package into constraints.txt (the venv's and the images' versions)"
	@echo "make bench    reproflow vs bare torch timing loops, Aceso search cost, runs, compare and history on a year"
	@echo "              of nightly runs (100,000 points; CATALOG_BENCH=\"--clusters 3 --points 913 --baseline REV\":"
	@echo "              a million, each step with commit REV beside) -> benchmarks/results/*.csv"
	@echo "make bench-gpu  (GPU node) GEMM vs bare torch.mm and the bf16 peak -> benchmarks/results/gpu/gemm.csv"
	@echo "make containers  build the images (FLAVOURS=gpu cpu) and squash them -> \$$APPS/reproflow-<flavour>.sqsh"
	@echo "make gpu-image-here  build the gpu image here on a stand-in CUDA base, squash it, check inside it"

# constraints.txt pins every package; the images install through the same file.
$(BIN)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 'reproflow needs Python 3.11 or newer \
	(its lock, torch 2.13 and DeepSpeed are resolved for it); $(PYTHON) is ' + sys.version.split()[0] + \
	'. Install python3.11 and run: make PYTHON=python3.11 ...')"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	@$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $@

venv: $(BIN)/.installed

# A fresh resolve of pyproject.toml with every extra, written to constraints.txt (then run make test).
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet '.[$(EXTRAS)]'
	{ sed -n '/^#/p' constraints.txt; .lock-venv/bin/python -m pip freeze --all --exclude-editable \
		| grep -iv -e '^reproflow' -e '^pip==' | sed 's/+[a-z0-9.]*$$//'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .lock-venv

# The main job: the whole small reproduction here, then where everything is.
demo: reproduce
	@echo
	@echo "report page (self-contained HTML) and twin: $(REPORTS)/report.html, $(REPORTS)/report.md; claims: $(REPORTS)/claims.md"
	@echo "results (CSV, one file per point): $(RESULTS)/<suite>/<experiment>/"
	@echo "tables (CSV + markdown):           $(REPORTS)/param_comms_table.md, $(REPORTS)/param_compute_gemm.md,"
	@echo "                                   $(REPORTS)/resharding_1_to_m.md, _ratios.md, $(REPORTS)/resharding_n_to_m.md"
	@echo "figures (PNG + PDF):               $(REPORTS)/param_comms_busbw_<collective>.png, $(REPORTS)/param_compute_gemm_tflops.png,"
	@echo "                                   $(REPORTS)/resharding_1_to_m.png, $(REPORTS)/resharding_n_to_m.png"
	@echo "Aceso (profile -> search -> train): $(REPORTS)/aceso/e2e_thpt_small_<model>.csv, e2e_baseline_small_<model>.csv"
	@echo "                                   (every Megatron-LM plan measured), fig7_e2e_small.png,"
	@echo "                                   fig8_search_cost_small.png, fig9_perf_model_small.png; logs: $(LOGS)/aceso/"
	@echo "CFP (analysis -> profile -> search): $(REPORTS)/cfp_analysis.md, cfp_search.md, cfp_step_time.png;"
	@echo "                                   ParallelBlocks, strategy maps and profiles: $(LOGS)/cfp/"
	@echo "spatial parallelism (MPI):         $(REPORTS)/spatial_throughput.md, spatial_check.md, spatial_images_per_s.png"
	@echo "step logs:                         $(LOGS)/reproduce/<step>.log"

reproduce: venv
	$(REPRODUCE) $(if $(ONLY),--only $(ONLY))

$(FIGURES): venv
	$(REPRODUCE) --only $@

archive: venv
	$(BIN)/reproflow archive --results $(RESULTS) --reports $(REPORTS) --logs $(LOGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# What the tests run containers with: Debian's packages (tests/packages.sh), Enroot and Pyxis built from
# source (tests/enroot-pyxis.sh), and the CPU image built and squashed by `enroot import` (containers/).
test-setup: venv
	bash tests/packages.sh
	bash tests/enroot-pyxis.sh
	bash tests/cpu-image.sh $(IMAGES) $(BIN)/python

# The tests' commands with a real 2-node Slurm cluster up (tests/slurm/start.sh; Pyxis loaded where
# installed), stopped afterwards.
WITH_CLUSTER = REPROFLOW_CPU_IMAGE=$(abspath $(IMAGES))/reproflow-cpu.sqsh bash tests/slurm/with-cluster.sh

# Every test. Two pytest-xdist workers: one takes the Slurm tests (mostly waiting for the cluster), the
# other the rest; then the `timing` tests alone.
TEST_WORKERS ?= 2
test: lint test-setup
	$(BIN)/reproflow render --check
	$(WITH_CLUSTER) bash -c ' \
		$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not timing" --durations=30; shared=$$?; \
		$(BIN)/python -m pytest -m timing --durations=5; alone=$$?; \
		exit $$(( shared || alone ))'

# The unit tests: no Slurm, no image, no process group, nothing marked slow.
test-fast: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not slurm and not slow and not distributed"

# The fault-injection suite alone (it is also part of `make test`), with its summary line.
faults: test-setup
	$(WITH_CLUSTER) $(BIN)/python -m pytest -q tests/test_faults.py tests/test_inputs.py

# The whole reproduction as a cluster user runs it, on the test cluster: the CPU image, five shaped nodes,
# make reproduce EXECUTOR=slurm through Pyxis, then compare against this checkout's make demo run, if any
# (tests/cluster-reproduce.sh; opt-in: too long for make test).
cluster-reproduce: venv
	bash tests/cluster-reproduce.sh $(CLUSTER_RUN)

# The README's two commands on a fresh Debian machine (tests/clean-room.sh): run it before calling a
# change to the set-up (Makefile, pyproject.toml, constraints.txt, tests/slurm, containers, tests/*.sh) done.
CLUSTER_RUN ?= cluster-run
CLEAN_ROOM ?= test demo
clean-room:
	bash tests/clean-room.sh $(CLEAN_ROOM)

figures: venv
	$(BIN)/reproflow report --results $(RESULTS) --out $(REPORTS)

# The table of every claim and the verdicts' error rates, simulated through the judge: docs/claims.md.
CLAIMS_SIMULATED ?= 4000
claims-doc: venv
	{ printf '# The claims\n\nGenerated by `make claims-doc` (`reproflow claims --simulate %s`); edit the claims in each family'"'"'s `claims.py`, not here.\n\n' $(CLAIMS_SIMULATED); \
	  $(BIN)/reproflow claims --simulate $(CLAIMS_SIMULATED); } > docs/claims.md

# The figures the README and docs quote from runs, rewritten from the runs recorded in docs/recorded/
# (tools/docs.py, the standard library only; `python3 tools/docs.py record REPORTS --note ...` records one).
docs:
	python3 tools/docs.py

sbatch: venv
	$(BIN)/reproflow render

bench: venv
	$(BIN)/python benchmarks/param_bench.py --out benchmarks/results
	$(BIN)/python benchmarks/aceso_bench.py --out benchmarks/results
	$(BIN)/python benchmarks/catalog_bench.py --out benchmarks/results $(CATALOG_BENCH)
	$(BIN)/python benchmarks/history_bench.py --out benchmarks/results

# On a GPU node: GEMM against a bare torch.mm loop and the dense bf16 peak (figures kept in benchmarks/results/gpu).
bench-gpu: venv
	$(BIN)/python benchmarks/gpu_bench.py --out benchmarks/results/gpu

# FLAVOURS: gpu (the default; for the cluster) and/or cpu; APPS: where the squash files go.
FLAVOURS ?= gpu
containers:
	bash containers/build.sh $(FLAVOURS)

# The gpu flavour built here, where NVIDIA's registry and AWS's EFA installer cannot be reached (opt-in, too
# long for make test; its summary gives its time and size): a stand-in CUDA base (containers/cuda-standin.
# Dockerfile), every other step the cluster's own, squashed by enroot import into $(IMAGES); then the checks
# inside the squash file and `reproflow doctor --image` against the test cluster.
gpu-image-here: venv
	bash tests/packages.sh
	bash tests/enroot-pyxis.sh
	CUDA_STANDIN=1 APPS=$(abspath $(IMAGES)) PYTHON=$(abspath $(BIN))/python bash containers/build.sh gpu
	bash containers/check-gpu-image.sh $(IMAGES)
	$(WITH_CLUSTER) $(BIN)/reproflow doctor --image $(abspath $(IMAGES))/reproflow-gpu.sqsh \
		--results $(abspath $(IMAGES))/doctor-results

# Only the project's own folders: RESULTS, REPORTS and LOGS may come from the environment (a cluster's
# shared results folder), and what they name is the user's to remove.
clean:
	@for d in $(foreach v,RESULTS REPORTS LOGS,"$($(v))"); do case "$$d" in results|reports|logs|./results|./reports|./logs) ;; \
	  *) echo "make clean: leaves $$d alone (named by RESULTS, REPORTS or LOGS, not the project's own folder)";; esac; done
	rm -rf -- results reports logs reproflow-archive.tar.gz
	find benchmarks/results -mindepth 1 -maxdepth 1 ! -name gpu -exec rm -rf {} + 2>/dev/null || true

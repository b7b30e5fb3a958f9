# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv
# (idempotent: a second run only checks the stamp).
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
export FM_HOME ?= $(CURDIR)/.fm
export DAGSTER_HOME ?= $(FM_HOME)/dagster

.PHONY: venv demo test test-fast bench ui mlflow-ui clean

$(STAMP): pyproject.toml constraints.txt
	@echo ">> bootstrapping $(VENV) with $(PY)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(PIP) install --upgrade pip 2>&1 | grep -v "is ignored: it is neither" || true
	@# torch first and pinned: unpinned it pulls gigabytes of CUDA packages.
	@$(PIP) install torch==2.13.0 2>&1 | grep -v "is ignored: it is neither" || true
	@$(PIP) install -c constraints.txt -e '.[dev]' 2>&1 | grep -v "is ignored: it is neither" || true
	@$(BIN)/python -c "import torch, dagster, fm_pipeline.definitions" || (echo "install failed" && exit 1)
	@touch $(STAMP)

venv: $(STAMP)

demo: venv
	@mkdir -p $(DAGSTER_HOME)
	$(BIN)/fm demo

test: venv
	$(BIN)/python -m pytest -q -ra -p no:cacheprovider

bench: venv
	$(BIN)/python -m benchmarks.data

ui: venv
	@mkdir -p $(DAGSTER_HOME)
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean:
	rm -rf $(FM_HOME)

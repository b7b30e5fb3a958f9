# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv
# (idempotent: a second run only checks the stamp).
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
export FM_HOME ?= $(CURDIR)/.fm
export DAGSTER_HOME ?= $(FM_HOME)/dagster


.PHONY: venv system-deps cluster-build demo test image bench readme-table ui mlflow-ui clean

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

# Chromium, iproute2 and PostgreSQL from Debian's packages where absent (scripts/system_deps.sh).
system-deps:
	@bash scripts/system_deps.sh

# The dev cluster's components, built from Go modules once per set of versions and cached
# (docs/kubernetes.md): the tests in tests/devcluster start them.
cluster-build: venv
	@$(BIN)/fm dev cluster build

test: venv system-deps cluster-build
	$(BIN)/python -m pytest -q -ra -p no:cacheprovider --durations=25

# Each prints one JSON object as its last line (benchmarks.gpu_mfu needs a GPU: not here).
BENCHMARKS ?= data data_stages datatrove_dedup remote_data trainer fsdp_keep checkpoint planner planner_fidelity simulation recovery k8s
# Each JSON is saved as $(BENCH_DIR)/<name>.json; the README's table is rendered from them.
BENCH_DIR ?= $(FM_HOME)/bench
bench: venv cluster-build
	@mkdir -p $(BENCH_DIR)
	@for b in $(BENCHMARKS); do echo ">> benchmarks.$$b"; \
	  { $(BIN)/python -m benchmarks.$$b; echo $$? > $(BENCH_DIR)/$$b.rc; } | tee $(BENCH_DIR)/$$b.out; \
	  test "$$(cat $(BENCH_DIR)/$$b.rc)" = 0 || exit 1; \
	  tail -n 1 $(BENCH_DIR)/$$b.out | $(BIN)/python -m benchmarks.stamp > $(BENCH_DIR)/$$b.json; done
	@$(BIN)/python -m benchmarks.table $(BENCH_DIR) | tee $(BENCH_DIR)/table.md

# The image the rendered manifests run (Dockerfile; needs a container engine, which this
# project's machines lack: docs/kubernetes.md, "The image").
IMAGE ?= fm-pipeline:latest
image:
	docker build -t $(IMAGE) .

# The README's table is rendered from the committed fixtures (copy a run's JSON there first);
# tests/test_readme_tables.py fails when the two differ.
readme-table: venv
	$(BIN)/python -m benchmarks.table tests/bench_fixtures --readme README.md

# The two UIs, on loopback: Dagster (webserver + daemon) and MLflow over FM_HOME's store.
UI_PORT ?= 3000
MLFLOW_PORT ?= 5000
MLFLOW_STORE ?= sqlite:///$(FM_HOME)/mlflow.db

ui: venv
	@echo ">> Dagster UI on http://127.0.0.1:$(UI_PORT) (DAGSTER_HOME=$(DAGSTER_HOME))"
	FM_MLFLOW_UI_URL=http://127.0.0.1:$(MLFLOW_PORT) $(BIN)/fm deploy ui --port $(UI_PORT)

# No job runner: 2 processes (~0.5 GB) instead of 9 (~1.9 GB); ~25 s to start on a new store.
mlflow-ui: venv
	@mkdir -p $(FM_HOME)/mlflow-artifacts
	@echo ">> MLflow UI on http://127.0.0.1:$(MLFLOW_PORT) ($(MLFLOW_STORE))"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow server \
		--backend-store-uri $(MLFLOW_STORE) --artifacts-destination $(FM_HOME)/mlflow-artifacts \
		--host 127.0.0.1 --port $(MLFLOW_PORT) --workers 1

clean:
	rm -rf $(FM_HOME)

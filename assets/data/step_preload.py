"""What every data_mix_job step needs, imported once by the forkserver that forks the steps
(data_run_config's preload_modules) instead of by each step process:

- Dagster's instance storage. A step opens the run's instance first thing, and cold that
  took ~0.5 s per step (SQLAlchemy, alembic and the storage modules); the PostgreSQL
  storage too when dagster-postgres is installed.
- Great Expectations (~2.6 s to import, paid by every check step), pyarrow, tokenizers, and
  what Dagster imports lazily per step (upath and fsspec for its state storage, dotenv, the
  compute-log manager): ~0.1 s more per step.

The forkserver drops a preload that fails to import without a word, so the list is imported
here, where a failure raises (tests/assets/test_data_assets.py imports it).
"""

import importlib

MODULES = (
    "alembic.runtime.migration", "alembic.script", "sqlalchemy.dialects.sqlite",
    "dagster._core.storage.sqlite_storage", "dagster._core.storage.local_compute_log_manager",
    "dagster._core.secrets.env_file", "upath.core", "fsspec",
    "great_expectations", "great_expectations.expectations",
    "numpy", "pyarrow.parquet", "pyarrow.dataset", "tokenizers",
)
OPTIONAL = ("dagster_postgres",)  # not a dependency of a local install

for name in MODULES:
    importlib.import_module(name)
for name in OPTIONAL:
    try:
        importlib.import_module(name)
    except ImportError:
        pass

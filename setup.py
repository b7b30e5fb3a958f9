"""Package discovery only; everything else is in pyproject.toml.

The Dagster layer lives in top-level assets/ and resources/ but installs as
fm_pipeline.assets and fm_pipeline.resources (setuptools package-dir)."""

from setuptools import find_packages, setup

DAGSTER_LAYER = ("assets", "resources")

packages = find_packages(include=["fm_pipeline", "fm_pipeline.*"])
# Folders of package data only (no __init__.py): declared, or setuptools warns it drops them.
packages += ["fm_pipeline.launch.crd_schemas"]
for top in DAGSTER_LAYER:
    packages += [f"fm_pipeline.{p}" for p in find_packages(include=[top, f"{top}.*"])]

setup(
    packages=packages,
    package_dir={f"fm_pipeline.{top}": top for top in DAGSTER_LAYER},
)

"""Deploying fm-pipeline on Dagster: the instance (dagster.yaml: the run queue, the run
launcher, run monitoring, sqlite or PostgreSQL storage; workspace.yaml) and the Dagster
processes fm starts for itself (dagster-daemon, dagster-webserver). Imports no Dagster:
it writes configuration and starts processes. docs/orchestration.md, "Deployment".
"""

"""A training job's Dagster runs, apart from the definitions that make them (assets/,
resources/): what they are called and tagged (names), the run requests a sensor yields for a
segment (requests, submit), what the instance's records say of a job (history, summary,
api_jobs), the REST API's orchestrator on the instance (orchestrator.DagsterOrchestrator), and
the Kubernetes Job a data-mix step becomes under dagster-k8s's executor (data_k8s).
Part of the Dagster layer: the domain core never imports it."""

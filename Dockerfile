# The image the rendered manifests run (`cluster.image`, default fm-pipeline:latest):
# Python 3.11, torch 2.13.0 from PyPI (its CUDA 13 build: the CUDA libraries come as
# wheels, the driver from the node through the NVIDIA container toolkit), this package's
# wheel with its runtime dependencies at the pins of constraints.txt, no dev extras.
#   make image                       # docker build -t fm-pipeline:latest .
# What the manifests run from it (torchrun -m fm_pipeline.train, python -m
# fm_pipeline.checkpoint.fast_keeper, /bin/sh for the preStop hook) is checked against the
# wheel by tests/test_packaging.py. Not built on this project's machines (no container
# engine there): docs/kubernetes.md, "The image".
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md constraints.txt ./
COPY fm_pipeline fm_pipeline
COPY assets assets
COPY resources resources
RUN pip wheel --no-deps --no-cache-dir -w /dist .

FROM python:3.11-slim
# torch first and pinned, as `make venv` does: unpinned, the resolver may take another build.
RUN pip install --no-cache-dir torch==2.13.0
COPY --from=wheel /dist /dist
COPY constraints.txt /dist/
RUN pip install --no-cache-dir -c /dist/constraints.txt /dist/fm_pipeline-*.whl \
    && rm -rf /dist
ENV PYTHONUNBUFFERED=1
WORKDIR /workspace
CMD ["fm", "--help"]

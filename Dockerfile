# syntax=docker/dockerfile:1
#
# One image for the rlkube operator and the train/eval pods (`rlkube operator`, `rlkube pod`).
#
#   CPU (default):  docker build -t rlkube:dev .
#   GPU (CUDA):     docker build -t rlkube:dev-cuda \
#                     --build-arg BASE_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04 \
#                     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu130 .
#
# The builder installs a self-contained CPython (python-build-standalone, via uv) under
# /opt/python and a virtual environment under /opt/venv, then builds rlkube's wheel and installs
# it. The final stage copies just those two directories onto BASE_IMAGE, so any glibc base
# works (Debian slim for CPU, NVIDIA's CUDA runtime for GPU) and no compiler, uv or pip cache
# reaches it. The torch CUDA wheels carry their own CUDA libraries; the CUDA base adds the
# NVIDIA_* settings the container toolkit reads and the CUDA runtime for user extensions.

ARG BASE_IMAGE=debian:bookworm-slim
ARG BUILDER_IMAGE=debian:bookworm-slim
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

FROM ${BUILDER_IMAGE} AS builder
ARG PYTHON_VERSION=3.11
# The CPU wheel index by default; a CUDA index (e.g. .../whl/cu130) for GPU images.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1
RUN uv python install "${PYTHON_VERSION}" \
    && uv venv --python "${PYTHON_VERSION}" /opt/venv
# torch first, from its own index, in its own layer: it is most of the image and changes least.
RUN uv pip install --python /opt/venv/bin/python --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runtime ./runtime
COPY operator ./operator
RUN uv build --wheel --out-dir /wheels . \
    && uv pip install --python /opt/venv/bin/python /wheels/rlkube-*.whl \
    && /opt/venv/bin/rlkube --version \
    && /opt/venv/bin/python -c "import torch, gymnasium, grpc, kopf, rlkube.spec, rlkube_operator.rbac"

FROM ${BASE_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="rlkube" \
      org.opencontainers.image.description="Reinforcement learning on Kubernetes: the RLJob operator and the train/eval pod runtime" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# tini as PID 1 reaps the subprocesses of async vector envs and forwards SIGTERM, so an eval pod
# drains within its grace period. Versions are not pinned: BASE_IMAGE may be Debian or Ubuntu.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 rlkube \
    && useradd --system --uid 10001 --gid rlkube --home-dir /home/rlkube --create-home \
       --shell /usr/sbin/nologin rlkube \
    && install -d -o rlkube -g rlkube /var/lib/rlkube /etc/rlkube
COPY --from=builder /opt/python /opt/python
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    HOME=/home/rlkube
USER 10001:10001
WORKDIR /home/rlkube
ENTRYPOINT ["/usr/bin/tini", "--", "rlkube"]
CMD ["--help"]

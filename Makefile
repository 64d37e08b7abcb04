# The README's commands. Each target does its own set-up on a machine that has only Python 3.11+.
#   make demo     run examples/cartpole.yaml as a local cluster (train ranks + eval workers)
#   make test     install with the dev extra, lint, build the control plane, and run the test suite
#                 (all but the kind e2e run)
#   make controlplane build kube-apiserver, kube-controller-manager and kube-scheduler from
#                 devcluster/kubernetes/go.mod (needs Go; minutes once per machine, cached in
#                 ~/.cache/rlkube/controlplane) and print where they are
#   make kueue    build Kueue's manager (sigs.k8s.io/kueue v0.17.0; needs Go; minutes once per machine,
#                 cached in ~/.cache/rlkube/kueue) for the tests and `make cluster CLUSTER_ARGS=--kueue`
#   make test-quick   the same without the multi-process runs marked slow (minutes, for development)
#   make test-all     everything, the kind e2e run included (it needs Docker; `make e2e` runs it alone)
#   make cluster  start the real Kubernetes control plane (built by `make controlplane`), node agents
#                 that run pods as local processes and the operator; print the KUBECONFIG to export
#                 (CLUSTER_ARGS="--simulate-training": nothing runs in the pods, training is faked)
#   make lint     ruff, mypy, import layers, yamllint, shellcheck, hadolint
#   make gpu-check on a machine with an NVIDIA GPU: NCCL selection, CUDA weight copies, a DDP step
#   make generate regenerate crds/, the chart's CRD copy, docs/rljob-reference.md and runtime/rlkube/_proto

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch comes from pip's configured index (a local CPU wheel where one is set up). Plain PyPI serves
# the CUDA build on Linux x86-64 (several GB); for the CPU-only build point TORCH_PIP_ARGS at its index:
#   make test TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
DEMO_JOB ?= examples/cartpole.yaml
DEMO_ARGS ?= --nodes 2 --summary runs/demo-summary.json
PYTEST_ARGS ?=
CLUSTER_ARGS ?=
# The dev cluster's source root (package rlkube_devcluster): in the repository, not in the wheel.
DEVCLUSTER := devcluster

.PHONY: demo test test-quick controlplane kueue test-all lint generate cluster bench bench-scaling gpu-check wheelhouse clean

$(VENV)/.base: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "rlkube needs Python 3.11 or newer")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PY) -c 'import torch' 2>/dev/null || $(PIP) install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PIP) install --quiet -e ".[dev]"
	$(PY) scripts/install_helm.py --venv $(VENV)
	touch $@

demo: $(VENV)/.base
	$(VENV)/bin/rlkube run $(DEMO_JOB) $(DEMO_ARGS)

# Which tests each target runs (pytest markers, see pyproject.toml).
TEST_MARKERS ?= not e2e

test: $(VENV)/.dev
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory controlplane
	$(MAKE) --no-print-directory kueue
	@set +e; $(PY) -m pytest -m "$(TEST_MARKERS)" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

test-quick:
	$(MAKE) --no-print-directory test TEST_MARKERS="not e2e and not slow"

test-all:
	$(MAKE) --no-print-directory test TEST_MARKERS="e2e or not e2e"

# The delivery linters use the same options as tests/delivery (which runs them too).
SHELLCHECK_ARGS := --severity=style --enable=all --exclude=SC2250,SC2312
DELIVERY_YAML := charts/rlkube/Chart.yaml charts/rlkube/values.yaml charts/rlkube/values-gpu.yaml \
	examples/rljob-kind.yaml examples/rljob-gpu.yaml e2e/kind.yaml

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PYTHONPATH=$(DEVCLUSTER)$${PYTHONPATH:+:$$PYTHONPATH} $(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(VENV)/bin/yamllint --strict -c tests/delivery/yamllint.yaml $(DELIVERY_YAML)
	$(VENV)/bin/shellcheck $(SHELLCHECK_ARGS) e2e/run.sh benchmarks/gpu_check.sh benchmarks/device_session.sh
	$(VENV)/bin/hadolint Dockerfile

generate: $(VENV)/.dev
	$(PY) scripts/generate.py

# Built before pytest runs, so no test waits minutes on a cold Go build under its own timeout.
controlplane: $(VENV)/.dev
	PYTHONPATH=$(DEVCLUSTER)$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m rlkube_devcluster.controlplane.build

kueue: $(VENV)/.dev
	PYTHONPATH=$(DEVCLUSTER)$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m rlkube_devcluster.kueue.build

cluster: $(VENV)/.dev controlplane $(if $(findstring --kueue,$(CLUSTER_ARGS)),kueue)
	PYTHONPATH=$(DEVCLUSTER)$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m rlkube_devcluster $(CLUSTER_ARGS)

bench: $(VENV)/.base
	$(PIP) install --quiet -e ".[bench]"
	$(VENV)/bin/rlkube bench weights --json runs/bench-weights.json
	$(VENV)/bin/rlkube bench rollout --json runs/bench-rollout.json

# Collection scaling on a many-core machine (issue #24): the intake ceiling (plumbing only, CartPole-
# and Atari-sized fragments, training off and on) and the rollout rows with their ceiling column.
SCALING_WORKERS ?= 1 4 8 14
bench-scaling: $(VENV)/.base
	$(PIP) install --quiet -e ".[bench]"
	$(VENV)/bin/rlkube bench intake --producers $(SCALING_WORKERS) --train-us-per-step 0 26 --json runs/bench-intake-cartpole.json
	$(VENV)/bin/rlkube bench intake --shape atari --producers 1 4 --seconds 20 --json runs/bench-intake-atari.json
	$(VENV)/bin/rlkube bench rollout --workers $(SCALING_WORKERS) --requests batched --no-ray --json runs/bench-rollout-scaling.json

# The GPU acceptance check: rlkube run on the GPU, checkpoint/resume, CUDA weight plane (~5 min).
gpu-check: $(VENV)/.base
	bash benchmarks/gpu_check.sh

# Wheels for a machine with no network that already has torch (an air-gapped GPU node, a lent GPU
# machine): .whl/ for CPython 3.12 on x86-64 Linux, less what WHEELHOUSE_PRESENT says it has.
# There: pip install --no-index --no-deps --target DIR .whl/*.whl; DIR first on PYTHONPATH.
# benchmarks/device_session.sh does that and then measures (docs/operations.md, "No network").
WHEELHOUSE_PRESENT ?= torch==2.11.0 numpy==2.5.2 matplotlib tensorboard pyyaml rich pillow
WHEELHOUSE_ARGS ?= --python-version 3.12 --leave-out kopf --leave-out kubernetes --budget-mb 56
wheelhouse: $(VENV)/.base
	$(PY) scripts/wheelhouse.py --dest .whl $(addprefix --present ,$(WHEELHOUSE_PRESENT)) \
		$(WHEELHOUSE_ARGS) "gymnasium[mujoco]>=1.1" "py-spy>=0.4"

clean:
	rm -rf runs .pytest_cache .ruff_cache

# --- Delivery: the image, the chart, the kind end-to-end run ------------------------------------
#   make image       build the CPU image rlkube:<version> (needs Docker)
#   make image-gpu   build the CUDA image rlkube:<version>-cuda (needs Docker)
#   make chart       lint the Helm chart and package it into dist/
#   make e2e         run e2e/run.sh on a throw-away kind cluster (needs Docker and kind; E2E_ARGS=--dry-run)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REVISION := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
DOCKER ?= docker
IMAGE ?= rlkube:$(VERSION)
GPU_IMAGE ?= rlkube:$(VERSION)-cuda
# Keep the CUDA base and the torch wheel index on the same CUDA major version.
GPU_BASE_IMAGE ?= nvidia/cuda:13.0.1-runtime-ubuntu24.04
GPU_TORCH_INDEX ?= https://download.pytorch.org/whl/cu130
E2E_ARGS ?=

.PHONY: image image-gpu chart e2e

image:
	$(DOCKER) build --tag $(IMAGE) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) .

image-gpu:
	$(DOCKER) build --tag $(GPU_IMAGE) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
		--build-arg BASE_IMAGE=$(GPU_BASE_IMAGE) --build-arg TORCH_INDEX=$(GPU_TORCH_INDEX) .

chart: $(VENV)/.dev
	$(VENV)/bin/helm lint --strict charts/rlkube
	$(VENV)/bin/helm lint --strict charts/rlkube --values charts/rlkube/values-gpu.yaml
	$(VENV)/bin/helm package charts/rlkube --destination dist

e2e: $(VENV)/.dev
	HELM="$(abspath $(VENV)/bin/helm)" bash e2e/run.sh $(E2E_ARGS)

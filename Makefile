# fracgpu — build, test and demo entry points. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export FRACGPU_CACHE ?= $(HOME)/.cache/fracgpu
PYTEST := $(PY) -m pytest -p no:cacheprovider

.PHONY: help venv lock lint typecheck unit integration e2e test demo-down binaries mock-nvml proto crds image cluster-up cluster-down demo bench gpu-check-bundle gpu-check clean

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

# constraints.txt pins every runtime and dev dependency (and pip) for CPython 3.11-3.13 on linux x86-64; the
# image (Dockerfile, harness/image/build.py) and the real-GPU bundle install the same pins. `make lock` rewrites it.
CONSTRAINTS := constraints.txt
LOCK_PYTHONS := 3.12 3.13
LOCK_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(CONSTRAINTS) --upgrade pip
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[dev]'
	touch $@

venv: $(VENV)/.installed ## create .venv with the project and its dev tools, at the versions pinned in constraints.txt

lock: ## re-pin constraints.txt after a pyproject.toml change (LOCK_ARGS=--upgrade moves every pin to the newest)
	@test -x $(VENV)/bin/pip-compile || $(MAKE) venv
	CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile --quiet --extra dev --strip-extras --allow-unsafe \
	  --no-emit-index-url --no-emit-find-links $(LOCK_ARGS) --output-file $(CONSTRAINTS) pyproject.toml
	@# Resolved on this interpreter: check the same pins resolve, as wheels, on the other supported ones.
	for v in $(LOCK_PYTHONS); do \
	  $(PY) -m pip install -q --dry-run --ignore-installed --only-binary=:all: --target "$$(mktemp -d)" \
	    --implementation cp --python-version $$v $(addprefix --platform ,$(LOCK_PLATFORMS)) \
	    -c $(CONSTRAINTS) '.[dev]' || exit 1; \
	done
	$(PY) -m pytest -p no:cacheprovider -q tests/unit/harness/test_lock.py

lint: venv ## ruff lint and format check; the import contracts between packages (lint-imports)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: venv ## mypy (strict)
	$(VENV)/bin/mypy

unit: venv ## unit and protocol tests (fast, no cluster)
	$(PYTEST) tests/unit

binaries: ## build the pinned upstream components from their Go modules (cached in $FRACGPU_CACHE)
	bash harness/cluster/build-binaries.sh

mock-nvml: ## build the mock libnvidia-ml.so.1 (simulated GPUs) into build/mocknvml
	bash harness/mocknvml/build.sh build/mocknvml

proto: venv ## regenerate the gRPC/protobuf code from kubelet_plugin/serving/proto/*.proto
	$(PY) -m kubelet_plugin.serving.proto.generate

integration: venv binaries ## tests against a real control plane built from upstream
	$(PYTEST) tests/integration

e2e: venv binaries ## end to end: single-node cluster (kubelet, containerd, CDI) in a netns, driver via Helm
	$(PYTEST) e2e

test: lint typecheck unit integration e2e ## everything CI runs: lint, types and every test tier

cluster-up: venv binaries ## start a local control plane (no node) in .cluster/ (prints its KUBECONFIG)
	$(PY) -m harness.cluster up --state-dir .cluster

cluster-down: venv ## stop the local control plane and remove .cluster/
	$(PY) -m harness.cluster down --state-dir .cluster

demo: venv binaries ## local cluster with 2 simulated GPUs, fracgpu installed by Helm, fractional pods; keeps running
	$(PY) -m e2e.demo up --state-dir .demo

demo-down: venv ## stop the demo cluster and remove .demo/
	$(PY) -m e2e.demo down --state-dir .demo

image: venv ## container image as an OCI archive, without Docker (build/image/fracgpu-<tag>.oci.tar)
	$(PY) -m harness.image.build --out build/image

bench: venv binaries ## benchmarks against a real control plane (plugin bench also go-builds e2e/bench/goref into the cache; its throttled run, about 2 min, compares it under an APF storm); writes build/bench/
	$(PY) -m e2e.bench.plugin_bench
	$(PY) -m e2e.bench.plugin_bench --throttled --out build/bench/plugin-throttled.json
	$(PY) -m e2e.bench.controller_bench --out build/bench/controller.json
	$(PY) -m e2e.bench.usage_bench --out build/bench/usage.json
	$(PY) -m e2e.bench.scheduler_bench --out build/bench/scheduler.json
	$(PY) -m e2e.bench.ha_bench --out build/bench/ha.json

crds: venv ## regenerate api/crds/*.yaml from the pydantic models in api/ (and the chart's copy)
	$(PY) -m api.crds
	cp api/crds/*.yaml charts/fracgpu/crds/

gpu-check-bundle: venv ## what the real-GPU check carries (toolkit, static runc, rootfs, wheels) into build/gpu-check
	$(PY) -m harness.gpu.bundle --out build/gpu-check

gpu-check: ## run the real-GPU check here (root, NVIDIA driver and GPU; the bundle built): see docs/gpu-check.md
	harness/gpu/check.sh

clean: ## remove the virtualenv and build outputs (the binary cache stays)
	rm -rf $(VENV) build dist *.egg-info

# syntax=docker/dockerfile:1
# fracgpu: one image for both components (fracgpu-controller and fracgpu-kubelet-plugin).
#
#   rev=$(git rev-parse --short HEAD)
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$rev -t fracgpu:0.1.0-$rev .
#
# Our own tests assemble the same layout without Docker: `python -m harness.image.build` (see harness/image/).
ARG PYTHON_IMAGE=python:3.11-slim
# Same Debian release as the Python image: nvidia-ctk and nvidia-cdi-hook link glibc (cgo), and the hook runs
# on the host, so it must not need a newer glibc than mainstream nodes have.
ARG GO_IMAGE=golang:1.26-bookworm
# Keep in step with harness/cluster/versions.env (NVIDIA_CTK_VERSION), which the Docker-less build uses.
ARG NVIDIA_CTK_VERSION=v1.20.2

# NVIDIA Container Toolkit commands for the node plugin's driver edits (--driver-edits=toolkit): nvidia-ctk
# generates the driver's CDI edits, nvidia-cdi-hook is copied to the host for the runtime to call. Link flags as
# in the toolkit's Makefile (NVML symbols resolve at run time from the driver; only libc is needed).
FROM ${GO_IMAGE} AS toolkit
ARG NVIDIA_CTK_VERSION
WORKDIR /src
RUN go mod init fracgpu.dev/upstream/nvidia-container-toolkit \
 && module=github.com/NVIDIA/nvidia-container-toolkit \
 && printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "%s/cmd/nvidia-cdi-hook"\n\t_ "%s/cmd/nvidia-ctk"\n)\n' \
      "$module" "$module" > tools.go \
 && go get "$module@${NVIDIA_CTK_VERSION}" && go mod tidy \
 && CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -trimpath \
      -ldflags "-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy' -X $module/internal/info.version=${NVIDIA_CTK_VERSION#v}" \
      -o /out/ "$module/cmd/nvidia-ctk" "$module/cmd/nvidia-cdi-hook"

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/fracgpu
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY api ./api
COPY controller ./controller
COPY kubelet_plugin ./kubelet_plugin
# Install the wheel and its dependencies at the pins `make venv` and CI test, precompile, then drop the installer.
RUN /opt/fracgpu/bin/pip install --no-compile -c constraints.txt . \
 && /opt/fracgpu/bin/python -m compileall -q -o 0 -o 2 /opt/fracgpu/lib \
 && /opt/fracgpu/bin/pip uninstall -y setuptools pip

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="fracgpu" \
      org.opencontainers.image.description="Kubernetes DRA driver sharing NVIDIA GPUs by memory (controller and node plugin)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# Same base image as the builder, so the venv's python symlink (/usr/local/bin/python3) resolves.
COPY --from=builder /opt/fracgpu /opt/fracgpu
COPY --from=toolkit /out/nvidia-ctk /out/nvidia-cdi-hook /usr/bin/
ENV PATH=/opt/fracgpu/bin:$PATH VIRTUAL_ENV=/opt/fracgpu PYTHONUNBUFFERED=1
RUN groupadd --gid 65532 fracgpu \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin fracgpu
# Non-root by default (the controller needs nothing else). The node plugin's DaemonSet overrides this with
# runAsUser: 0, since it needs /dev, the kubelet's plugin directories and the CDI spec directory.
USER 65532:65532
CMD ["fracgpu-controller", "--help"]

#!/usr/bin/env bash
# Build pinned upstream components from their Go modules into a cache outside the repo.
#
#   harness/cluster/build-binaries.sh [component ...]
#
# Components: kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd containerd ctr
# containerd-shim-runc-v2 helm nvidia-ctk nvidia-cdi-hook nvidia-container-runtime runc
# (default: all). Each lands at $FRACGPU_CACHE/bin/<component>-<version>; present binaries are skipped.
# Nothing is written into the repository; Go's module and build caches are the usual ones.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../e2e/cluster/versions.env
source "$here/../../e2e/cluster/versions.env"
cache=${FRACGPU_CACHE:-$HOME/.cache/fracgpu}
bin="$cache/bin"
mkdir -p "$bin" "$cache/src"
export GOFLAGS=${GOFLAGS:--mod=mod}
export CGO_ENABLED=${CGO_ENABLED:-1}

kube=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
toolkit=(nvidia-ctk nvidia-cdi-hook nvidia-container-runtime)
all=("${kube[@]}" etcd containerd ctr containerd-shim-runc-v2 helm "${toolkit[@]}" runc)
want=("$@"); [ ${#want[@]} -gt 0 ] || want=("${all[@]}")

version_of() {
  case "$1" in
    kube-*|kubelet|kubectl) echo "$KUBERNETES_VERSION" ;;
    etcd) echo "$ETCD_VERSION" ;;
    containerd|ctr|containerd-shim-runc-v2) echo "$CONTAINERD_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    nvidia-ctk|nvidia-cdi-hook|nvidia-container-runtime) echo "$NVIDIA_CTK_VERSION" ;;
    runc) echo "$RUNC_VERSION" ;;
    *) echo "unknown component: $1 (known: ${all[*]})" >&2; exit 2 ;;
  esac
}

missing() {  # the subset of the given components whose binary is absent
  local c; for c in "$@"; do [ -x "$bin/$c-$(version_of "$c")" ] || echo "$c"; done
}

log() { printf '[build-binaries %s] %s\n' "$(date +%T)" "$*" >&2; }

# new_module DIR MODULE: a fresh wrapper module in DIR.
new_module() {
  rm -rf "$1"; mkdir -p "$1"
  (cd "$1" && go mod init "$2" >/dev/null 2>&1)
}

build_kube() {
  local todo=("$@") dir="$cache/src/kubernetes-$KUBERNETES_VERSION"
  [ ${#todo[@]} -gt 0 ] || return 0
  log "building ${todo[*]} $KUBERNETES_VERSION (first time: downloads modules and compiles for many minutes)"
  if [ ! -f "$dir/.ready" ]; then
    new_module "$dir" fracgpu.dev/upstream/kubernetes
    (
      cd "$dir"
      go mod download k8s.io/kubernetes@"$KUBERNETES_VERSION"
      local gomod; gomod=$(go mod download -json k8s.io/kubernetes@"$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
      # k8s.io/kubernetes requires its staging modules at v0.0.0 with local replaces; point each at its tag.
      local m
      for m in $(awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod"); do
        go mod edit -replace "$m=$m@$KUBERNETES_STAGING_VERSION"
      done
      go mod edit -require k8s.io/kubernetes@"$KUBERNETES_VERSION"
      cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
      go mod tidy -e >/dev/null 2>&1 || true
      touch .ready
    )
  fi
  local minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  local out="$cache/src/kube-out"; rm -rf "$out"; mkdir -p "$out"
  local pkgs=(); for c in "${todo[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -tags providerless -ldflags "$ld" -o "$out/" "${pkgs[@]}")
  for c in "${todo[@]}"; do mv "$out/$c" "$bin/$c-$KUBERNETES_VERSION"; log "built $bin/$c-$KUBERNETES_VERSION"; done
}

build_etcd() {
  [ -n "$(missing etcd)" ] || return 0
  local dir="$cache/src/etcd-$ETCD_VERSION"
  log "building etcd $ETCD_VERSION"
  new_module "$dir" fracgpu.dev/upstream/etcd
  cat > "$dir/main.go" <<'GO'
// Command etcd: the upstream etcd server entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$dir" && go get go.etcd.io/etcd/server/v3@"$ETCD_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null \
    && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/etcd-$ETCD_VERSION" .)
  log "built $bin/etcd-$ETCD_VERSION"
}

build_containerd() {
  local todo=("$@"); [ ${#todo[@]} -gt 0 ] || return 0
  local dir="$cache/src/containerd-$CONTAINERD_VERSION"
  log "building ${todo[*]} $CONTAINERD_VERSION"
  new_module "$dir" fracgpu.dev/upstream/containerd
  cat > "$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
GO
  local ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  local out="$cache/src/containerd-out"; rm -rf "$out"; mkdir -p "$out"
  (cd "$dir" && go get github.com/containerd/containerd/v2@"$CONTAINERD_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null 2>&1 || true
   cd "$dir" && local pkgs=() && for c in "${todo[@]}"; do pkgs+=("github.com/containerd/containerd/v2/cmd/$c"); done \
   && CGO_ENABLED=1 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ld" -o "$out/" "${pkgs[@]}")
  for c in "${todo[@]}"; do mv "$out/$c" "$bin/$c-$CONTAINERD_VERSION"; log "built $bin/$c-$CONTAINERD_VERSION"; done
}

build_helm() {
  [ -n "$(missing helm)" ] || return 0
  local dir="$cache/src/helm-$HELM_VERSION"
  log "building helm $HELM_VERSION"
  new_module "$dir" fracgpu.dev/upstream/helm
  cat > "$dir/tools.go" <<'GO'
//go:build tools

package tools

import _ "helm.sh/helm/v3/cmd/helm"
GO
  local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  (cd "$dir" && go get helm.sh/helm/v3@"$HELM_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null 2>&1 || true
   cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$bin/helm-$HELM_VERSION" helm.sh/helm/v3/cmd/helm)
  log "built $bin/helm-$HELM_VERSION"
}

# NVIDIA Container Toolkit commands. cgo is required (go-nvml dlopens libnvidia-ml); the link flags are the
# toolkit Makefile's, so NVML symbols resolve at run time from the driver, and the binaries need only libc.
build_toolkit() {
  local todo=("$@"); [ ${#todo[@]} -gt 0 ] || return 0
  local module=github.com/NVIDIA/nvidia-container-toolkit dir="$cache/src/nvidia-container-toolkit-$NVIDIA_CTK_VERSION"
  log "building ${todo[*]} $NVIDIA_CTK_VERSION"
  new_module "$dir" fracgpu.dev/upstream/nvidia-container-toolkit
  cat > "$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk"
)
GO
  local ext="-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy"
  local ld="-s -w '-extldflags=$ext' -X $module/internal/info.version=${NVIDIA_CTK_VERSION#v}"
  local out="$cache/src/nvidia-container-toolkit-out"; rm -rf "$out"; mkdir -p "$out"
  (cd "$dir" && go get "$module@$NVIDIA_CTK_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null 2>&1 || true
   cd "$dir" && local pkgs=() && for c in "${todo[@]}"; do pkgs+=("$module/cmd/$c"); done \
   && CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations" \
      go build -trimpath -ldflags "$ld" -o "$out/" "${pkgs[@]}")
  for c in "${todo[@]}"; do mv "$out/$c" "$bin/$c-$NVIDIA_CTK_VERSION"; log "built $bin/$c-$NVIDIA_CTK_VERSION"; done
}

# runc as a static executable (the real-GPU check carries it to machines whose libc and libseccomp are unknown).
# cgo is required (nsenter); seccomp and libpathrs are left out (each needs a static C library), so the
# container specs it runs must not ask for a seccomp profile.
build_runc() {
  [ -n "$(missing runc)" ] || return 0
  local dir="$cache/src/runc-$RUNC_VERSION"
  log "building runc $RUNC_VERSION (static)"
  new_module "$dir" fracgpu.dev/upstream/runc
  cat > "$dir/tools.go" <<'GO'
//go:build tools

package tools

import _ "github.com/opencontainers/runc"
GO
  (cd "$dir" && go get github.com/opencontainers/runc@"$RUNC_VERSION" >/dev/null 2>&1 && go mod tidy >/dev/null 2>&1 || true
   cd "$dir" && CGO_ENABLED=1 go build -trimpath -buildmode=pie -tags "urfave_cli_no_docs netgo osusergo" \
     -ldflags "-s -w -X main.gitCommit=$RUNC_VERSION -linkmode external -extldflags -static-pie" \
     -o "$bin/runc-$RUNC_VERSION" github.com/opencontainers/runc)
  log "built $bin/runc-$RUNC_VERSION"
}

for c in "${want[@]}"; do version_of "$c" >/dev/null; done  # an unknown component stops here, naming the known ones
kube_todo=(); ctd_todo=(); ctk_todo=(); other=()
for c in $(missing "${want[@]}"); do
  case "$c" in
    kube-*|kubelet|kubectl) kube_todo+=("$c") ;;
    containerd|ctr|containerd-shim-runc-v2) ctd_todo+=("$c") ;;
    nvidia-ctk|nvidia-cdi-hook|nvidia-container-runtime) ctk_todo+=("$c") ;;
    *) other+=("$c") ;;
  esac
done
for c in "${other[@]}"; do "build_$c"; done
build_kube "${kube_todo[@]}"
build_containerd "${ctd_todo[@]}"
build_toolkit "${ctk_todo[@]}"
for c in "${want[@]}"; do ln -sfn "$c-$(version_of "$c")" "$bin/$c"; done
log "ready: ${want[*]} in $bin"

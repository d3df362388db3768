"""A persistent mount namespace per node of a multi-node cluster: one host, several nodes' own paths.

The nodes of a local cluster share the host's file system, but a DaemonSet has one set of host paths for
every node (`kubeletDir`, `cdiDir`, `driverRoot`). Each node's containerd and kubelet (and so every container
they start) therefore run in a mount namespace of their own in which NODE_ROOT is that node's directory
(bind-mounted there, shared within the namespace for the kubelet's mount propagation), and so are the
kubelets' pod log directories (each kubelet removes log directories of pods it does not know).
The namespace is a slave of the host's: mounts made inside it (pod volumes, container root file systems)
never appear on the host or in another node; files written below the node directory do, under its host path.
"""

import subprocess
from dataclasses import dataclass
from pathlib import Path

NODE_ROOT = Path("/run/fracgpu-node")
"""Where every node sees its own directory: host paths in the chart's values are below it."""
POD_LOG_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"))
MOUNTNS_DIR = Path("/run/fracgpu-mntns")  # on a private mount: a namespace file cannot live on a shared one


def _mounts() -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]


def _run(*argv: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


@dataclass(frozen=True)
class MountNamespace:
    """`MOUNTNS_DIR/<name>`: NODE_ROOT is `node_dir` and the pod log directories are below it, in there only."""

    name: str
    node_dir: Path

    @property
    def path(self) -> Path:
        return MOUNTNS_DIR / self.name

    def exec_prefix(self) -> list[str]:
        """nsenter options that enter this mount namespace (combine with a network namespace's)."""
        return [f"--mount={self.path}"]

    def host_path(self, inside: Path) -> Path:
        """Where a path below NODE_ROOT inside the namespace is on the host."""
        return self.node_dir / inside.relative_to(NODE_ROOT)

    def create(self) -> "MountNamespace":
        """Create the namespace (replacing a leftover of the same name) with its bind mounts."""
        self.delete()
        MOUNTNS_DIR.mkdir(parents=True, exist_ok=True)
        if str(MOUNTNS_DIR) not in _mounts():
            _run("mount", "--bind", str(MOUNTNS_DIR), str(MOUNTNS_DIR))
        _run("mount", "--make-private", str(MOUNTNS_DIR))
        self.path.touch()
        _run("unshare", f"--mount={self.path}", "--propagation", "slave", "true")
        binds = [(self.node_dir, NODE_ROOT)] + [(self.node_dir / "logs" / d.name, d) for d in POD_LOG_DIRS]
        for source, target in binds:
            source.mkdir(parents=True, exist_ok=True)
            target.mkdir(parents=True, exist_ok=True)  # the mount point, on the host (empty there)
            self.run("mount", "--bind", str(source), str(target))
        self.run("mount", "--make-rshared", str(NODE_ROOT))
        return self

    def run(self, *argv: str) -> str:
        """Run a command in this mount namespace (the host's network); its stdout."""
        done = subprocess.run(
            ["nsenter", *self.exec_prefix(), "--", *argv], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} in mount namespace {self.name} failed: {done.stderr.strip()}")
        return done.stdout

    def delete(self) -> None:
        """Drop the namespace; it and its mounts go once no process is left in it."""
        if self.path.exists():
            subprocess.run(["umount", str(self.path)], capture_output=True, check=False)
            self.path.unlink(missing_ok=True)

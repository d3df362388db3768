"""Which pod and container a host process belongs to, from its ``/proc/<pid>/cgroup`` (pure parsing + one read).

The kubelet puts each container in a cgroup below its pod's, whose name carries the pod UID:

- cgroupfs driver: ``/kubepods[/burstable|/besteffort]/pod<uid>/<container id>``;
- systemd driver: ``/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/
  <runtime>-<container id>.scope`` (``cri-containerd-``, ``crio-``, ``docker-``); with a cgroup root such as
  kind's ``/kubelet`` the slices are ``kubelet-kubepods-<qos>-pod<uid>.slice``.

A line is ``<hierarchy id>:<controllers>:<path>``; cgroup v2 has the single line ``0::<path>``, v1 one line
per hierarchy, hybrid both. The pod may appear below a prefix (a node in a container, a kubelet in a slice),
so the pod segment is searched anywhere in the path. The v2 line is preferred; with cgroup v1 (or a hybrid
node whose v2 hierarchy holds no pods) the first v1 line naming a pod is used. Static pods have 32-hex UIDs.
"""

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_CGROUPFS_POD = re.compile(rf"^pod({_UID})$")
_SYSTEMD_POD = re.compile(rf"^(?:[a-z0-9.]+-)+pod({_UID})\.slice$")  # the slice names its whole path
_CONTAINER = re.compile(r"^(?:(?:cri-containerd|crio|docker|containerd)-)?([0-9a-f]{12,128})(?:\.scope)?$")


class PodContainer(BaseModel):
    """A process's pod (UID, dashed as the API server writes it) and container ID (None for the pod's own
    cgroup, e.g. a process of the sandbox)."""

    model_config = ConfigDict(frozen=True)

    pod_uid: str
    container_id: str | None = None


class CgroupUnreadableError(Exception):
    """``/proc/<pid>/cgroup`` could not be read (the process ended, or no permission); the message says which."""


def pod_of_path(path: str) -> PodContainer | None:
    """The pod and container a cgroup path names, None when it names no pod."""
    segments = [s for s in path.split("/") if s]
    for i, segment in enumerate(segments):
        match = _CGROUPFS_POD.match(segment) or _SYSTEMD_POD.match(segment)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-")
        container = None
        if i + 1 < len(segments):
            found = _CONTAINER.match(segments[i + 1])
            container = found.group(1) if found else None
        return PodContainer(pod_uid=uid, container_id=container)
    return None


def pod_of_cgroup_file(text: str) -> PodContainer | None:
    """The pod of a process from the text of its ``/proc/<pid>/cgroup``: the v2 line first, then v1 lines in
    order; None when no line names a pod (a host process). Malformed lines are ignored."""
    unified: list[str] = []
    legacy: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        (unified if hierarchy == "0" and controllers == "" else legacy).append(path)
    for path in unified + legacy:
        found = pod_of_path(path)
        if found is not None:
            return found
    return None


def pod_of_pid(proc_root: Path, pid: int) -> PodContainer | None:
    """The pod of host process ``pid`` (``proc_root`` is the host's ``/proc``); None for a process of no pod.
    Raises ``CgroupUnreadableError``."""
    path = proc_root / str(pid) / "cgroup"
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise CgroupUnreadableError(f"cannot read {path}: {err.strerror or err}") from None
    return pod_of_cgroup_file(text)

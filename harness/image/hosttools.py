"""Host commands the image build and the local containerd need, installed with apt-get when missing."""

import os
import shutil
import subprocess
from collections.abc import Mapping

# Command -> Debian package providing it.
IMAGE_BUILD_COMMANDS = {"debootstrap": "debootstrap", "chroot": "coreutils", "tar": "tar"}
CONTAINER_RUNTIME_COMMANDS = {"runc": "runc"}

_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def which(command: str) -> str | None:
    """shutil.which that also looks in the sbin directories (absent from some users' PATH)."""
    path = os.environ.get("PATH", os.defpath)
    return shutil.which(command, path=os.pathsep.join([path, *_SBIN]))


def require_commands(commands: Mapping[str, str]) -> dict[str, str]:
    """Absolute paths of `commands` (name -> Debian package); apt-get installs the packages of missing ones."""
    missing = sorted({pkg for cmd, pkg in commands.items() if which(cmd) is None})
    if missing:
        apt_install(missing)
    found: dict[str, str] = {}
    for cmd in commands:
        path = which(cmd)
        if path is None:
            raise RuntimeError(f"{cmd} is still missing after installing {commands[cmd]}")
        found[cmd] = path
    return found


def apt_install(packages: list[str]) -> None:
    """`apt-get install -y --no-install-recommends packages`, after `apt-get update` if the first try fails."""
    if os.geteuid() != 0:
        raise PermissionError(
            f"missing host packages {packages}: install them as root (apt-get install {' '.join(packages)})"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    print(f"[hosttools] installing {' '.join(packages)} with apt-get", flush=True)
    if subprocess.run(argv, env=env, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=True)
        subprocess.run(argv, env=env, check=True)

"""Test-only start-up hook of a node plugin process (put this directory on its PYTHONPATH): SIGKILL the process
at a named point of the claim flow, once, when the file named by ``FRACGPU_TEST_KILL_AT`` holds that point's name.

Points: ``before-checkpoint-save`` (a prepare's files and specs are written, its checkpoint is not) and
``before-file-removal`` (an unprepare has saved the checkpoint without its claims, their files are still there).
The file is removed before the kill, so the restarted process runs normally.
"""

import os
import signal
from pathlib import Path
from typing import Any

_CONTROL = os.environ.get("FRACGPU_TEST_KILL_AT")


def _kill_at(point: str) -> None:
    assert _CONTROL is not None
    control = Path(_CONTROL)
    try:
        wanted = control.read_text().strip()
    except FileNotFoundError:
        return
    if wanted == point:
        control.unlink()
        os.kill(os.getpid(), signal.SIGKILL)


if _CONTROL:
    from kubelet_plugin.prepare.journal import ClaimJournal
    from kubelet_plugin.state.claim_files import ClaimStore

    _save, _remove = ClaimJournal.save, ClaimStore.remove

    def _save_or_die(self: ClaimJournal, checkpoint: Any) -> None:
        _kill_at("before-checkpoint-save")
        _save(self, checkpoint)

    def _remove_or_die(self: ClaimStore, claim_uid: str) -> None:
        _kill_at("before-file-removal")
        _remove(self, claim_uid)

    ClaimJournal.save = _save_or_die  # type: ignore[method-assign]
    ClaimStore.remove = _remove_or_die  # type: ignore[method-assign]

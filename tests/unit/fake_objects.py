"""An in-memory object store with the API server's write semantics, for the Lease and Secret tests.

As kube-apiserver does: GET of a missing object is 404; POST of an existing name is 409 AlreadyExists; PUT
without the stored resourceVersion is 409 Conflict, and a missing object 404; every write bumps the
resourceVersion. Thread-safe (the code under test calls it from worker threads). `before_get` runs before each
GET answers (a test makes two callers read before either writes); `fail` makes the next requests raise.
"""

import copy
import itertools
import threading
from collections.abc import Callable
from typing import Any

from api.kube_errors import ApiError, api_error


class FakeObjects:
    """Objects by API path (`<collection>/<name>`)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []  # (method, path) of each successful write, in order
        self.fail: list[ApiError] = []
        self.before_get: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._versions = itertools.count(1)

    def _maybe_fail(self) -> None:
        with self._lock:
            if self.fail:
                raise self.fail.pop(0)

    def get(self, path: str) -> dict[str, Any]:
        self._maybe_fail()
        with self._lock:
            found = copy.deepcopy(self.objects.get(path))
        if self.before_get is not None:
            self.before_get()
        if found is None:
            raise api_error(404, "Not Found", '{"reason": "NotFound"}')
        return found

    def create(self, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail()
        path = f"{collection}/{body['metadata']['name']}"
        with self._lock:
            if path in self.objects:
                raise api_error(409, "Conflict", '{"reason": "AlreadyExists"}')
            return self._store("POST", path, body)

    def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail()
        with self._lock:
            stored = self.objects.get(path)
            if stored is None:
                raise api_error(404, "Not Found", '{"reason": "NotFound"}')
            if body.get("metadata", {}).get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                raise api_error(409, "Conflict", '{"reason": "Conflict", "message": "the object has been modified"}')
            return self._store("PUT", path, body)

    def _store(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(body)
        stored.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        stored["metadata"].setdefault("uid", f"uid-{path.rsplit('/', 1)[-1]}")
        self.objects[path] = stored
        self.writes.append((method, path))
        return copy.deepcopy(stored)

    def edit(self, path: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Change a stored object as another client would (a new resourceVersion)."""
        with self._lock:
            body = copy.deepcopy(self.objects[path])
            change(body)
            self._store("PUT", path, body)

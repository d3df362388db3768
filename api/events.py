"""core/v1 Events, built and posted one way by both components (what `kubectl describe` shows under Events).

`event_body` builds an Event about one object; `post_event` creates it and says whether it exists now. An Event
goes to the namespace of the object it is about (`default` for a cluster-scoped one, as kubectl looks there). Its
message is made one line here, for every Event of both components (`one_line`: `kubectl get events` shows a
message up to its first newline).
Imports only `api.kube_rest`.
"""

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from api.kube_errors import ApiConflict, ApiError, ApiNamespaceTerminating
from api.kube_rest import KubeRest

log = logging.getLogger(__name__)
MESSAGE_LIMIT = 1024
"""The longest message the API server keeps in an Event (longer ones are cut here)."""


def one_line(message: str) -> str:
    """`message` with every run of whitespace (newlines and tabs included, as in a CEL selector quoted from a
    claim that spans lines) made one space, and none at either end."""
    return " ".join(message.split())


def involved_object(
    api_version: str,
    kind: str,
    name: str,
    *,
    namespace: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
) -> dict[str, str]:
    """An Event's `involvedObject`: the fields given, none of them empty."""
    fields = {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": resource_version,
    }
    return {k: v for k, v in fields.items() if v}


def event_body(
    involved: Mapping[str, str],
    reason: str,
    message: str,
    *,
    component: str,
    instance: str,
    type_: str = "Warning",
    name: str | None = None,
    host: str | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """The Event `reason` about `involved`, reported by `component` (`instance`: which replica or node; `host`:
    the node, for a node agent). `name`: the Event's name (a deterministic one makes a repeated post meet
    AlreadyExists); None: the API server picks one after `<involved name>.`. The message is made one line
    (`one_line`) and cut to `MESSAGE_LIMIT`."""
    at = (now or datetime.datetime.now(datetime.UTC)).astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = involved.get("namespace") or "default"
    metadata = {"name": name} if name else {"generateName": f"{involved['name']}."}
    return {
        "metadata": {**metadata, "namespace": namespace},
        "involvedObject": dict(involved),
        "reason": reason,
        "message": one_line(message)[:MESSAGE_LIMIT],
        "type": type_,
        "source": {"component": component, **({"host": host} if host else {})},
        "reportingComponent": component,
        "reportingInstance": instance[:128],
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }


def post_event(rest: KubeRest, body: Mapping[str, Any]) -> bool:
    """Create the Event `body`; never raises. True when it exists now (created, or AlreadyExists: posted before
    under the same name) or never can be (its namespace is being deleted); False when a later try may succeed.
    A failure is logged with what the API server said."""
    namespace = body["metadata"]["namespace"]
    involved = body.get("involvedObject") or {}
    extra = {
        "reason": body.get("reason"),
        "object": f"{involved.get('kind')} {involved.get('namespace', '')}/{involved.get('name')}",
    }
    try:
        rest.create(f"/api/v1/namespaces/{namespace}/events", dict(body))
    except ApiConflict:
        return True  # posted before (by this process or an earlier one)
    except ApiNamespaceTerminating:
        log.debug("could not post Event: its namespace is being deleted", extra=extra)
        return True  # never postable: not worth a warning or a retry
    except ApiError as err:
        log.warning("could not post Event", extra={**extra, "error": str(err)})
        return False
    except Exception as err:  # a bug or a broken connection: a later try may succeed
        log.warning("could not post Event", extra={**extra, "error": f"{type(err).__name__}: {err}"})
        return False
    return True

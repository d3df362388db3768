"""Which pending requests no published GPU can ever satisfy, and the constraint no device meets (pure).

A request alternative needs devices that pass every selector (its DeviceClass's, then its own) and admit its
memory amount: one (a memory amount, or none: a whole GPU), `count` distinct ones of one node (a claim's devices
all come from one node: our slices are node-local), or at least one (allocationMode All). A request is
unsatisfiable when every alternative is (`firstAvailable`: the message gives each one's reason). A MIG GPU itself
(``type: mig-parent``) is never a candidate: only its partitions are allocated.

When each request fits alone, the claim's requests together are searched node by node (``_Search``): one
alternative per request, distinct devices within a request, a whole GPU or a MIG partition not shared, shares of
one GPU adding up to at most its memory, and the claim's matchAttribute and distinctAttribute constraints. The
claim is reported only when no node passes; the search tries at most `MAX_PLACEMENTS` device placements per claim
and says nothing past that bound.

Every claim made is true over the published inventory (what is allocated already does not count: a busy GPU is
not an impossible one): a device is ruled out only by a selector that evaluates to false; a selector that cannot
be evaluated (controller/status/selectors.py) is assumed to rule nothing out, which can only widen what is
searched, so the conclusion holds whatever it decides; the message then says which selector was assumed so,
counts the devices it leaves as "at most", and says the requests "would" fit alone only under that assumption. A
constraint whose attribute some candidate does not carry as a bool, int or string (a version, a list) is left out
of the search. Rounding up to a request policy's step is not counted (it only adds memory). A request that fits
by memory and selectors but asks for more `compute` than any GPU it can use publishes (`compute_short`: none
published by an older node plugin) is named too; compute is not part of the search of requests together.
"""

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from api.mig import TYPE_MIG_PARENT
from api.quantity import format_bytes
from controller.core.claims import ClaimView, DeviceClassView, DeviceConstraint, GpuRequest
from controller.core.slices import DeviceRecord
from controller.status.selectors import NotEvaluated, evaluate

MAX_PLACEMENTS = 20_000
"""The bound of the joint search: device placements tried for one claim, over all nodes. A claim of a few
requests of a few GPUs each needs far fewer; past it nothing is said about the requests together."""

MAX_VALUES = 3
"""Attribute values listed per request in a matchAttribute message."""


class Unsatisfiable(BaseModel):
    """A request of a pending claim that no published GPU can satisfy."""

    model_config = ConfigDict(frozen=True)

    request: str
    """The first alternative's name (`gpu` or `gpu/large`); for requests impossible only together, their names
    joined by commas."""
    message: str


class _BoundError(Exception):
    """The joint search went past `MAX_PLACEMENTS`."""


def _gpus(n: int) -> str:
    return f"{n} published GPU{'s' if n != 1 else ''}"


def _asks(m: GpuRequest) -> str:
    """What the alternative asks for, as the message says it."""
    memory = f"{format_bytes(m.memory)} of GPU memory" if m.memory is not None else None
    admin = " with adminAccess" if m.admin_access else ""
    if m.all:
        each = f" with {memory} each" if memory else ""
        return f"request {m.request!r} asks for every GPU of a node it matches (allocationMode All){each}{admin}"
    if m.count == 1:
        return f"request {m.request!r} asks for {memory or 'a whole GPU'}{admin}"
    many = f"{m.count} GPUs with {memory} each" if memory else f"{m.count} whole GPUs"
    return f"request {m.request!r} asks for {many}{admin}"


def _attribute(device: DeviceRecord, name: str) -> bool | int | str | None:
    domain, _, ident = name.partition("/")
    return device.attributes.get(domain, {}).get(ident)


def _covers(constraint: DeviceConstraint, m: GpuRequest) -> bool:
    if not constraint.requests:
        return True
    return m.request.split("/")[0] in constraint.requests or m.request in constraint.requests


def _describe(constraint: DeviceConstraint) -> str:
    kind = "distinctAttribute" if constraint.distinct else "matchAttribute"
    over = ", ".join(repr(r) for r in constraint.requests) if constraint.requests else "all requests"
    return f"{kind} {constraint.attribute} ({over})"


class _Checks:
    """The selectors of one claim's alternatives over the devices, each evaluated at most once per device."""

    def __init__(self, device_class: DeviceClassView | Mapping[str, DeviceClassView] | None, driver: str) -> None:
        self._class = device_class
        self._driver = driver
        self._outcomes: dict[tuple[str, str, str], bool | NotEvaluated] = {}
        self.unknown: dict[str, NotEvaluated] = {}

    def labelled(self, m: GpuRequest) -> list[tuple[str, str]]:
        """The alternative's selectors, each with where it comes from."""
        cls = self._class.get(m.device_class) if isinstance(self._class, Mapping) else self._class
        out = [(e, f"of DeviceClass {cls.name}") for e in cls.selectors] if cls else []
        return out + [(e, "of the request") for e in m.selectors]

    def outcome(self, expression: str, device: DeviceRecord) -> bool | NotEvaluated:
        key = (expression, device.pool, device.device)
        found = self._outcomes.get(key)
        if found is None:
            found = self._outcomes[key] = evaluate(expression, device, self._driver)
            if isinstance(found, NotEvaluated):
                self.unknown.setdefault(expression, found)
        return found

    def passes(self, m: GpuRequest, device: DeviceRecord) -> bool:
        """No selector of the alternative rules `device` out."""
        return all(self.outcome(e, device) is not False for e, _ in self.labelled(m))

    def fits(self, m: GpuRequest, device: DeviceRecord) -> bool:
        """`device` may serve the alternative alone: its selectors and its memory amount."""
        return (m.memory is None or device.max_request >= m.memory) and self.passes(m, device)

    def not_evaluated(self, expressions: Iterable[str]) -> str:
        """The sentence for each of `expressions` that could not be evaluated on some device ("" when none)."""
        return "".join(
            f"; selector `{e}` could not be evaluated here ({u.reason}), so this check assumed it rules out no GPU"
            for e in dict.fromkeys(expressions)
            if (u := self.unknown.get(e)) is not None
        )


def selected_by(
    device_class: DeviceClassView | Mapping[str, DeviceClassView] | None, driver: str
) -> Callable[[GpuRequest, DeviceRecord], bool]:
    """Whether an alternative's selectors (its DeviceClass's, then its own) leave a device to it: one that cannot
    be evaluated rules nothing out. Each outcome is evaluated once per returned function."""
    return _Checks(device_class, driver).passes


def _none_fits(m: GpuRequest, devices: Sequence[DeviceRecord], checks: _Checks) -> str | None:
    """Why no device can serve the alternative; None when one may."""
    labelled = checks.labelled(m)
    passes = {e: 0 for e, _ in labelled}  # devices each selector does not rule out
    candidates = []
    for device in devices:
        ruled_out = False
        for expression, _ in labelled:
            if checks.outcome(expression, device) is False:
                ruled_out = True
            else:
                passes[expression] += 1
        if not ruled_out:
            candidates.append(device)
    asks = _asks(m)
    if candidates and (m.memory is None or any(d.max_request >= m.memory for d in candidates)):
        return None
    not_evaluated = checks.not_evaluated(e for e, _ in labelled)
    if len(candidates) == len(devices):
        largest = max(d.max_request for d in devices)
        return f"{asks}, and the largest GPU has {format_bytes(largest)}{not_evaluated}"
    if not candidates:
        none = [(e, where) for e, where in labelled if passes[e] == 0]
        if none:
            expression, where = none[0]
            return f"{asks}, but no published GPU matches selector `{expression}` ({where}){not_evaluated}"
        each = ", ".join(
            f"`{e}` ({where}: {'at most ' if e in checks.unknown else ''}{passes[e]})" for e, where in labelled
        )
        return f"{asks}, but no published GPU matches all of its selectors together: {each}{not_evaluated}"
    largest = max(d.max_request for d in candidates)
    selectors = ", ".join(f"`{e}` ({where})" for e, where in labelled)
    only = "at most" if not_evaluated else "only"
    return (
        f"{asks}, but {only} {_gpus(len(candidates))} of {len(devices)} match selectors {selectors}, "
        f"and the largest of them has {format_bytes(largest)}{not_evaluated}"
    )


def _alone(m: GpuRequest, devices: Sequence[DeviceRecord], checks: _Checks) -> str | None:
    """Why no node can serve the alternative on its own; None when one may."""
    need = 1 if m.all else m.count
    on_node: dict[str, int] = {}
    for device in devices:  # usually the first devices fit: no full scan for a request that fits
        if checks.fits(m, device):
            if need > 1 and not device.node_local:
                return None
            on_node[device.node] = on_node.get(device.node, 0) + 1
            if on_node[device.node] >= need:
                return None
    if not on_node:
        return _none_fits(m, devices, checks)
    node, most = max(on_node.items(), key=lambda item: item[1])
    larger = f" with at least {format_bytes(m.memory)}" if m.memory is not None else ""
    not_evaluated = checks.not_evaluated(e for e, _ in checks.labelled(m))
    up_to = "at most " if not_evaluated else ""
    return (
        f"{_asks(m)}, but a claim's GPUs all come from one node, and no node has {need} GPUs it can use (GPUs "
        f"its selectors and its DeviceClass's do not rule out{larger}): the most on one node is {up_to}{most} "
        f"(node {node}), of {up_to}{_gpus(sum(on_node.values()))} it can use{not_evaluated}"
    )


def compute_short(m: GpuRequest, devices: Sequence[DeviceRecord], checks: _Checks) -> str | None:
    """Why no device the alternative may use offers the compute it asks for (a GPU offers 100, a MIG partition its
    slices' share; a device of an older node plugin none); None when one does or it asks for none."""
    if not m.compute:
        return None
    usable = [d for d in devices if checks.fits(m, d)]
    if any(d.compute_total is not None and d.compute_total >= m.compute for d in usable):
        return None
    offered = [d.compute_total for d in usable if d.compute_total is not None]
    most = f"the most any of them offers is {max(offered)}" if offered else "none of them publishes compute"
    return (
        f"{_asks(m)} and compute {m.compute} (percent of a GPU), but of the {_gpus(len(usable))} it can use {most} "
        "(a shared GPU offers 100, a MIG partition its compute slices' share; an older node plugin publishes none)"
    )


class _Search:
    """Whether one node's devices can serve all of a claim's requests at once (see the module's docstring)."""

    def __init__(self, checks: _Checks, budget: list[int]) -> None:
        self._checks = checks
        self._budget = budget  # placements left, shared by every search of the claim

    def fits(
        self,
        requests: Sequence[tuple[GpuRequest, ...]],
        constraints: Sequence[DeviceConstraint],
        node: list[DeviceRecord],
    ) -> bool:
        pools = [[[d for d in node if self._checks.fits(m, d)] for m in alts] for alts in requests]
        active = [
            c
            for c in constraints
            if all(
                _attribute(d, c.attribute) is not None
                for alts, pool in zip(requests, pools, strict=True)
                for m, devices in zip(alts, pool, strict=True)
                if _covers(c, m)
                for d in devices
            )
        ]
        used: dict[tuple[str, str], int] = {}
        value_of: list[object] = [None for _ in active]  # matchAttribute: the value its devices hold
        holding: list[int] = [0 for _ in active]  # matchAttribute: how many devices hold it
        distinct: list[set[object]] = [set() for _ in active]

        def place(m: GpuRequest, device: DeviceRecord) -> Callable[[], None] | None:
            if self._budget[0] <= 0:
                raise _BoundError
            self._budget[0] -= 1
            consume = 0 if m.admin_access else m.memory if m.memory is not None else device.default_request
            before = used.get(device.key)
            if before is not None and not device.allow_multiple:
                return None
            if device.allow_multiple and (before or 0) + consume > device.memory_total:
                return None
            applied = [(i, c) for i, c in enumerate(active) if _covers(c, m)]
            for i, c in applied:
                value = _attribute(device, c.attribute)
                if (value in distinct[i]) if c.distinct else (holding[i] and value_of[i] != value):
                    return None
            used[device.key] = (before or 0) + consume
            for i, c in applied:
                value = _attribute(device, c.attribute)
                if c.distinct:
                    distinct[i].add(value)
                else:
                    value_of[i], holding[i] = value, holding[i] + 1

            def undo() -> None:
                if before is None:
                    del used[device.key]
                else:
                    used[device.key] = before
                for i, c in applied:
                    if c.distinct:
                        distinct[i].discard(_attribute(device, c.attribute))
                    else:
                        holding[i] -= 1

            return undo

        def devices(i: int, m: GpuRequest, pool: list[DeviceRecord], start: int, left: int) -> bool:
            if left == 0:
                return request(i + 1)
            for k in range(start, len(pool) - left + 1):  # combinations: a request's devices are distinct
                undo = place(m, pool[k])
                if undo is not None:
                    if devices(i, m, pool, k + 1, left - 1):
                        return True
                    undo()
            return False

        def request(i: int) -> bool:
            if i == len(requests):
                return True
            for m, pool in zip(requests[i], pools[i], strict=True):
                need = len(pool) if m.all else m.count  # All: every device it matches on the node, at least one
                if pool and len(pool) >= need and devices(i, m, pool, 0, need):
                    return True
            return False

        return request(0)


def _together(
    requests: Sequence[tuple[GpuRequest, ...]],
    constraints: Sequence[DeviceConstraint],
    nodes: Mapping[str, list[DeviceRecord]],
    checks: _Checks,
) -> str | None:
    """Why no node can serve the requests together, each of which fits alone; None when one may (or past the
    search's bound)."""
    budget = [MAX_PLACEMENTS]
    search = _Search(checks, budget)

    def anywhere(kept: Sequence[DeviceConstraint]) -> bool:
        return any(search.fits(requests, kept, node) for node in nodes.values())

    try:
        if anywhere(constraints):
            return None
    except _BoundError:
        return None
    asked = "; ".join(" or ".join(_asks(m) for m in alts) for alts in requests)
    try:
        if not anywhere(()):
            why = (
                "no node has GPUs for all of them at once (a request's GPUs are distinct, a whole GPU or a MIG "
                "partition is not shared, and shares of one GPU add up to at most its memory)"
            )
        else:
            alone = next((c for c in constraints if not anywhere((c,))), None)
            why = (
                _constraint_reason(alone, requests, nodes, checks)
                if alone is not None
                else "no node satisfies its constraints " + ", ".join(_describe(c) for c in constraints) + " together"
            )
    except _BoundError:
        why = "no node satisfies its constraints " + ", ".join(_describe(c) for c in constraints) + " together"
    not_evaluated = checks.not_evaluated(e for alts in requests for m in alts for e, _ in checks.labelled(m))
    fit = "each would fit alone if the selectors not evaluated ruled out no GPU" if not_evaluated else "each fits alone"
    return f"{asked}; {fit}, but {why}{not_evaluated}"


def _constraint_reason(
    c: DeviceConstraint,
    requests: Sequence[tuple[GpuRequest, ...]],
    nodes: Mapping[str, list[DeviceRecord]],
    checks: _Checks,
) -> str:
    """Why constraint `c` alone cannot be met on any node."""
    covered = [alts for alts in requests if all(_covers(c, m) for m in alts)]
    if c.distinct:
        need = sum(min(1 if m.all else m.count for m in alts) for alts in covered)
        most = max(
            len({_attribute(d, c.attribute) for d in node if any(checks.fits(m, d) for alts in covered for m in alts)})
            for node in nodes.values()
        )
        if most < need:
            return (
                f"constraint {_describe(c)} needs {need} GPUs with different {c.attribute} on one node, and no "
                f"node has more than {most} such values among the GPUs they can use"
            )
        return f"no node meets constraint {_describe(c)}"
    singles = [alts[0] for alts in covered if len(alts) == 1 and alts[0].count == 1 and not alts[0].all]
    per_device = all(len({_attribute(d, c.attribute) for d in node}) == len(node) for node in nodes.values())
    if per_device and len(singles) == len(covered) >= 2 and all(m.memory is not None for m in singles):
        # one value is one GPU: the shares of them all add up on it
        shared = [d for node in nodes.values() for d in node if all(checks.fits(m, d) for m in singles)]
        total = sum(0 if m.admin_access else m.memory or 0 for m in singles)
        largest = max((d.memory_total for d in shared), default=0)
        if shared and total > largest:
            return (
                f"constraint {_describe(c)} puts them on one GPU (each {c.attribute} is one GPU), and together they "
                f"ask for {format_bytes(total)} of GPU memory, where the largest GPU they can all use has "
                f"{format_bytes(largest)}"
            )
    values = []
    for alts in covered:
        seen = {
            str(v)
            for node in nodes.values()
            for d in node
            if any(checks.fits(m, d) for m in alts)
            if (v := _attribute(d, c.attribute)) is not None
        }
        shown = ", ".join(sorted(seen)[:MAX_VALUES]) + (", ..." if len(seen) > MAX_VALUES else "")
        values.append(f"{alts[0].request.split('/')[0]!r}: {shown}")
    return (
        f"constraint {_describe(c)}: no node has GPUs of one value for all of them (the values each can use: "
        f"{'; '.join(values)})"
    )


def plan_unsatisfiable(
    claim: ClaimView,
    devices: Iterable[DeviceRecord],
    device_class: DeviceClassView | Mapping[str, DeviceClassView] | None,
    driver: str,
    *,
    told: Collection[str] = (),
) -> tuple[Unsatisfiable, ...]:
    """The requests of a pending claim that no device in `devices` can satisfy (none while nothing is
    published: a GPU may still join). `device_class`: our DeviceClasses as the cluster has them, by name (each
    alternative is checked against the one it names; absent: unknown), or one for every alternative. `told`:
    requests (their first alternative's name) whose reason another Event gives: left out, and with any of them
    the requests are not searched together."""
    devices = [d for d in devices if d.kind != TYPE_MIG_PARENT]
    if claim.allocated or not devices:
        return ()
    checks = _Checks(device_class, driver)
    prefix = f"no GPU of {driver} can ever satisfy this claim: "
    out = []
    for alternatives in claim.requests:
        if alternatives[0].request in told:
            continue
        reasons = [_alone(m, devices, checks) or compute_short(m, devices, checks) for m in alternatives]
        if all(r is not None for r in reasons):
            because = "; or ".join(r for r in reasons if r is not None)
            out.append(Unsatisfiable(request=alternatives[0].request, message=prefix + because))
    if out or told or not (len(claim.requests) > 1 or claim.constraints) or not all(d.node_local for d in devices):
        return tuple(out)
    nodes: dict[str, list[DeviceRecord]] = {}
    for device in devices:
        nodes.setdefault(device.node, []).append(device)
    why = _together(claim.requests, claim.constraints, nodes, checks)
    if why is None:
        return ()
    names = ",".join(alts[0].request.split("/")[0] for alts in claim.requests)
    return (Unsatisfiable(request=names, message=prefix + why),)

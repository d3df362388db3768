"""The MPS step's container scripts beyond ``report.container_script``, and what they printed, read back (pure).

Each part prints sections after ``report.MARKER`` lines (``report.sections`` reads them back):

- ``pipe_lines``: the pipe directory as the container has it: its mount options (``/proc/self/mountinfo``), a
  write into it (refused when it is read-only), its listing, and an MPS client held open meanwhile the control
  client asks the daemon for its servers and their clients (the daemon's own word that the client connected: a
  CUDA client that cannot reach the daemon runs without MPS, silently);
- ``reply_lines``: control commands sent through ``nvidia-cuda-mps-control`` from inside, each reply with the
  client's exit status;
- ``shm_lines``: the container's ``/dev/shm``;
- ``cap_lines``: MPS clients started one after another, each holding 1 MiB, until one is refused, one says
  nothing for ``CLIENT_WAIT_S``, ``max_clients`` run or ``deadline_s`` passed.
"""

import re
import shlex
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from harness.gpu.report import MARKER, ProbeRun, json_line, sections
from kubelet_plugin.state.mps_files import PIPE_IN_CONTAINER

MAX_CLIENTS_REACHED = "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED"
CLIENT_WAIT_S = 10
"""How long a client may take to print its line (admitted or refused) before the cap step stops."""
COMMAND_TIMEOUT_S = 10
"""How long a control command or a one-off probe may take in a container."""
WRITE_TEST = "fracgpu-write-test"
_POLL = "0.05"
_POLLS = int(CLIENT_WAIT_S / float(_POLL))


class Reply(BaseModel):
    """What the control client printed for one command, and its exit status."""

    model_config = ConfigDict(frozen=True)

    command: str
    lines: list[str] = Field(default_factory=list)
    rc: int | None = None

    @property
    def text(self) -> str:
        return " / ".join(line.strip() for line in self.lines if line.strip())

    @property
    def refused(self) -> bool:
        """The client failed or the daemon answered ``Error...`` (the control client may exit 0 after one)."""
        return self.rc != 0 or any(line.strip().lower().startswith("error") for line in self.lines)

    def describe(self) -> str:
        return f"`{self.command}` answered {self.text or '(nothing)'!r} (exit {self.rc})"


class PipeView(BaseModel):
    """The pipe directory as a share's container had it, and a client held open through it."""

    model_config = ConfigDict(frozen=True)

    mount_options: str | None = None
    """The options of the container's (topmost) mount at the pipe directory; None: no such mount."""
    write_rc: int | None = None
    write_text: str = ""
    listing: list[str] = Field(default_factory=list)
    held: ProbeRun | None = None
    servers_text: str = ""
    """What the control command get_server_list printed (or why it did not run)."""
    clients: dict[int, list[str]] = Field(default_factory=dict)
    """Server pid -> what the control command get_client_list printed for it, word by word."""

    @property
    def read_only(self) -> bool:
        return self.mount_options is not None and "ro" in self.mount_options.split(",")

    @property
    def clients_listed(self) -> int:
        return sum(len([c for c in listed if c.isdigit()]) for listed in self.clients.values())


class CapView(BaseModel):
    """The MPS clients the cap step started, in order, and how the run ended."""

    model_config = ConfigDict(frozen=True)

    clients: list[ProbeRun] = Field(default_factory=list)
    seconds: int | None = None
    deadline: bool = False

    @staticmethod
    def admitted(client: ProbeRun) -> bool:
        """The client printed the probe's report (``error`` absent): the server took it."""
        return client.result is not None and "error" not in client.result

    @property
    def taken(self) -> int:
        return sum(1 for c in self.clients if self.admitted(c))

    @property
    def stopped_at(self) -> tuple[int, ProbeRun] | None:
        """The client (1-based) the run stopped at, not admitted: refused (an ``error`` line), silent for
        CLIENT_WAIT_S, or anything else it printed; None when every client started was admitted."""
        if self.clients and not self.admitted(self.clients[-1]):
            return len(self.clients), self.clients[-1]
        return None


def _q(value: str) -> str:
    return shlex.quote(value)


def bounded(busybox: str, argv: str, seconds: int = COMMAND_TIMEOUT_S) -> str:
    """Shell: `argv` killed after `seconds` (a client that waits for a daemon must not hold up the check)."""
    return f"{_q(busybox)} timeout -s KILL {seconds} {argv}"


def reply_lines(busybox: str, control: str, commands: Sequence[str]) -> list[str]:
    """Script lines sending each command through the control client `control`, one connection each."""
    client = bounded(busybox, _q(control))
    return [
        f"echo {MARKER} reply-{i}; echo {_q(c)} | {client} 2>&1; echo {MARKER} reply-{i}-rc $?"
        for i, c in enumerate(commands)
    ]


def replies(text: str, commands: Sequence[str]) -> list[Reply]:
    """The replies of ``reply_lines(..., commands)``, in order."""
    parts, rcs = sections(text)
    return [
        Reply(command=c, lines=parts.get(f"reply-{i}", []), rc=rcs.get(f"reply-{i}-rc")) for i, c in enumerate(commands)
    ]


def _wait_for_line(busybox: str, path: str) -> str:
    """Shell: wait until `path` has output, at most CLIENT_WAIT_S."""
    bb = _q(busybox)
    return f'n=0; while [ ! -s {path} ] && [ "$n" -lt {_POLLS} ]; do {bb} sleep {_POLL}; n=$((n + 1)); done'


def pipe_lines(busybox: str, probe: str, control: str | None, hold_s: int = 60) -> list[str]:
    """Script lines: the pipe directory's mount options, a write into it, its listing, and a client held open
    while the control client (when the container has one) lists the daemon's servers and their clients."""
    bb, pipe = _q(busybox), _q(PIPE_IN_CONTAINER)
    held = "/tmp/fracgpu-held.out"
    lines = [
        f"echo {MARKER} pipe-mount; {bb} awk -v p={pipe} '$5 == p {{print $6}}' /proc/self/mountinfo",
        f"echo {MARKER} pipe-write; {bb} touch {pipe}/{WRITE_TEST} 2>&1 && {bb} rm -f {pipe}/{WRITE_TEST}; "
        f"echo {MARKER} pipe-write-rc $?",
        f"echo {MARKER} pipe-ls; {bb} ls -la {pipe} 2>&1",
        f"echo {MARKER} held; {bb} rm -f {held}; {_q(probe)} 1 {hold_s} >{held} 2>&1 </dev/null & held=$!",
        _wait_for_line(busybox, held),
        f"{bb} cat {held}",
    ]
    if control is None:
        lines.append(f"echo {MARKER} servers; echo 'the driver edits mount no nvidia-cuda-mps-control'")
    else:
        c = bounded(busybox, _q(control))
        lines += [
            f'echo {MARKER} servers; servers=$(echo get_server_list | {c} 2>&1); echo "$servers"',
            f"echo {MARKER} server-clients",
            'for s in $servers; do case "$s" in *[!0-9]*) ;; '
            f'*) echo "$s: $(echo "get_client_list $s" | {c} 2>&1 | {bb} tr "\\n" " ")" ;; esac; done',
        ]
    lines.append(f'{bb} kill "$held" 2>/dev/null; wait "$held" 2>/dev/null; {bb} rm -f {held}; echo {MARKER} held-end')
    return lines


def pipe_view(text: str) -> PipeView:
    """What ``pipe_lines`` printed."""
    parts, rcs = sections(text)
    mounts = [line.strip() for line in parts.get("pipe-mount", []) if line.strip()]
    held_lines = parts.get("held")
    clients: dict[int, list[str]] = {}
    for line in parts.get("server-clients", []):
        pid, sep, listed = line.partition(":")
        if sep and pid.strip().isdigit():
            clients[int(pid)] = listed.split()
    return PipeView(
        mount_options=mounts[-1] if mounts else None,
        write_rc=rcs.get("pipe-write-rc"),
        write_text=" ".join(parts.get("pipe-write", [])).strip(),
        listing=parts.get("pipe-ls", []),
        held=None if held_lines is None else ProbeRun(result=json_line(held_lines), text="\n".join(held_lines)),
        servers_text=" ".join(line.strip() for line in parts.get("servers", []) if line.strip()),
        clients=clients,
    )


def pipe_problems(view: PipeView, *, with_control: bool) -> list[str]:
    """Why the pipe directory is not read-only, or a client cannot connect through it (empty: it is, it can)."""
    where = f"the pipe directory {PIPE_IN_CONTAINER}"
    read_only = f"{where} (read-only)"
    found: list[str] = []
    if view.mount_options is None:
        found.append(f"the container has no mount at {where}")
    elif not view.read_only:
        found.append(f"{where} is mounted {view.mount_options}, not read-only")
    if view.write_rc == 0:
        found.append(f"a write into {where} succeeded in the container")
    held = view.held
    result = held.result if held is not None else None
    if result is None or "error" in result:
        text = held.text.strip() if held is not None else ""
        found.append(f"an MPS client through {read_only} failed: {text or '(no output)'}")
    elif with_control and view.clients_listed == 0:
        found.append(
            f"the daemon listed no client while one was held through {read_only} (servers: "
            f"{view.servers_text or 'none'}): the client did not connect to it (CUDA then runs without MPS)"
        )
    return found


def shm_lines(busybox: str) -> list[str]:
    return [f"echo {MARKER} shm; {_q(busybox)} ls -a /dev/shm 2>&1"]


def shm_names(text: str) -> list[str]:
    parts, _ = sections(text)
    return [n for line in parts.get("shm", []) for n in line.split() if n not in {".", ".."}]


def cap_lines(busybox: str, probe: str, *, max_clients: int, deadline_s: int, hold_s: int) -> list[str]:
    """Script lines: start holding MPS clients one after another, each once the previous one printed its line,
    until one is refused or says nothing for CLIENT_WAIT_S, ``max_clients`` ran, or ``deadline_s`` passed; then
    end them all."""
    bb = _q(busybox)
    out = "/tmp/fracgpu-client-$i.out"
    return [
        f"echo {MARKER} clients",
        f"start=$({bb} date +%s); i=0; pids=",
        f'while [ "$i" -lt {max_clients} ]; do',
        "  i=$((i + 1))",
        f"  {bb} rm -f {out}; {_q(probe)} 1 {hold_s} >{out} 2>&1 </dev/null &",
        '  pids="$pids $!"',
        f"  {_wait_for_line(busybox, out)}",
        f'  echo "client $i $({bb} head -n 1 {out})"',
        f"  {bb} grep -q '\"driver_version\"' {out} || break",
        f"  if [ $(( $({bb} date +%s) - start )) -ge {deadline_s} ]; then echo deadline; break; fi",
        "done",
        f'echo "elapsed $(( $({bb} date +%s) - start ))"',
        f'[ -z "$pids" ] || {bb} kill $pids 2>/dev/null; wait; {bb} rm -f /tmp/fracgpu-client-*.out',
        f"echo {MARKER} clients-end",
    ]


_CLIENT = re.compile(r"^client (\d+) ?(.*)$")


def cap_view(text: str) -> CapView:
    """What ``cap_lines`` printed."""
    parts, _ = sections(text)
    clients: list[ProbeRun] = []
    seconds, deadline = None, False
    for line in parts.get("clients", []):
        if (m := _CLIENT.match(line)) is not None:
            rest = m.group(2).strip()
            clients.append(ProbeRun(result=json_line([rest]) if rest else None, text=rest))
        elif line.startswith("elapsed ") and line.split()[-1].isdigit():
            seconds = int(line.split()[-1])
        elif line.strip() == "deadline":
            deadline = True
    return CapView(clients=clients, seconds=seconds, deadline=deadline)


def _what(index: int, run: ProbeRun) -> str:
    """How client `index` was not admitted, in words."""
    result = run.result
    if result is not None:
        return f"client {index} refused: {result.get('error')} {result.get('result')} ({result.get('code')})"
    if not run.text:
        return f"client {index} printed nothing within {CLIENT_WAIT_S} s (neither admitted nor refused)"
    return f"client {index} printed {run.text[:300]!r}"


def cap_summary(view: CapView, *, max_clients: int, deadline_s: int) -> str:
    """One line: how many clients the server took, and how the run ended."""
    head = f"{view.taken} clients taken in {view.seconds if view.seconds is not None else '?'} s"
    stopped = view.stopped_at
    if stopped is not None:
        result = stopped[1].result or {}
        documented = (
            ""
            if "error" not in result
            else (", as documented" if result.get("result") == MAX_CLIENTS_REACHED else f", not {MAX_CLIENTS_REACHED}")
        )
        return f"{head}; {_what(*stopped)}{documented}"
    if view.deadline:
        return f"{head}; stopped at the {deadline_s} s bound, none refused"
    return f"{head}; none refused among {len(view.clients)} (the bound is {max_clients})"


def cap_problems(view: CapView, published: int) -> list[str]:
    """Why the server takes fewer clients than the plugin publishes (``mpsClients``), which would let the
    scheduler place a share the server refuses (empty: it took at least that many, or the run reached its time
    bound first, which the summary says)."""
    stopped = view.stopped_at
    if view.taken >= published or stopped is None:
        return []
    return [
        f"the MPS server took {view.taken} clients, fewer than the {published} the plugin publishes as "
        f"mpsClients ({_what(*stopped)})"
    ]

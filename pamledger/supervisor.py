"""`pamledger run`: one child process per role, restarted when it dies, all stopped together.

Each role (writer with its relay, query, projector, Subscribe gateway) gets its own interpreter, event
loop and NATS connection: on two cores a busy projector or a gateway fanning out to a thousand
subscriptions no longer delays the writer's replies, and a slow-consumer cut-off hits one role only.
Children get SIGTERM from the kernel if the supervisor dies without cleaning up, so a SIGKILLed
supervisor leaves no orphan holding a leadership lock. The local servers `run` started are watched too:
a dead nats-server or Postgres is restarted in place (same data dir, same port) with backoff.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

import structlog

from local_servers.processes import ServerWatch, die_with_parent
from pamledger.followers import FOLLOWERS

log = structlog.get_logger(__name__)

ROLES = ("writer", "query", *(spec.name for spec in FOLLOWERS), "gateway")  # every follower is a role
# Roles `all` leaves out unless settings turn them on (settings.retention.enabled); named, they run.
OPTIONAL_ROLES = ("retention",)
RESTART_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)
STOP_TIMEOUT = 15.0


def parse_roles(text: str, optional: Sequence[str] = ()) -> tuple[str, ...]:
    """`writer,query` -> ('writer', 'query'); `all` -> every role, with the `optional` roles settings turned
    on. Unknown names are an error."""
    known = ROLES + OPTIONAL_ROLES
    names = (*ROLES, *optional) if text.strip() == "all" else tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise ValueError(f"unknown role(s) {unknown}; choose from {','.join(known)} or all")
    return tuple(r for r in known if r in names)


def enabled_optional_roles(retention_enabled: bool) -> tuple[str, ...]:
    """The optional roles settings turn on (what `all` adds)."""
    return ("retention",) if retention_enabled else ()


@dataclass
class RoleProcess:
    """One `python -m pamledger serve --roles R` child and its restart bookkeeping."""

    role: str
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    not_before: float = 0.0
    exits: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "pamledger", "serve", "--roles", self.role],
                                        env=self.env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self.started_at = time.monotonic()
        log.info("supervisor.started", role=self.role, pid=self.process.pid, restarts=self.restarts)

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()


def supervise(env: dict[str, str], roles: Sequence[str] = ROLES, poll_seconds: float = 0.1,
              watches: Sequence[ServerWatch] = ()) -> int:
    """Run every role in its own child until SIGINT/SIGTERM; restart a child (or watched server) that dies."""
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    children = [RoleProcess(role, env) for role in roles]
    try:
        for child in children:
            child.start()
        while not stopping:
            for watch in watches:
                _revive_if_dead(watch, time.monotonic())
            now = time.monotonic()
            for child in children:
                _restart_if_dead(child, now)
            time.sleep(poll_seconds)
    finally:
        _stop_all(children)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _restart_if_dead(child: RoleProcess, now: float) -> None:
    code = child.poll()
    if code is None:
        return
    if child.not_before == 0.0:
        # A child that ran for a minute gets the short delay again; a crash loop backs off up to 5 s.
        if now - child.started_at > 60:
            child.restarts = 0
        delay = RESTART_BACKOFF[min(child.restarts, len(RESTART_BACKOFF) - 1)]
        child.not_before = now + delay
        child.exits.append(code)
        log.warning("supervisor.child_exited", role=child.role, exit_code=code, restart_in_seconds=delay)
        return
    if now >= child.not_before:
        child.not_before = 0.0
        child.restarts += 1
        child.start()


def _revive_if_dead(watch: ServerWatch, now: float) -> None:
    """Restart a dead server at once, then with backoff; one log line per change (died, failed, back)."""
    if watch.down_since is None:
        if watch.alive():
            return
        watch.down_since, watch.not_before = now, now
        log.warning("supervisor.server_died", server=watch.name)
    if now < watch.not_before:
        return
    try:
        watch.revive()
    except Exception as exc:  # noqa: BLE001 - any failure to start is retried; the loop must go on
        delay = RESTART_BACKOFF[min(watch.attempts, len(RESTART_BACKOFF) - 1)]
        watch.attempts += 1
        watch.not_before = time.monotonic() + delay
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if error != watch.last_error:
            log.warning("supervisor.server_restart_failed", server=watch.name, error=error, retry_in_seconds=delay)
        watch.last_error = error
        return
    log.info("supervisor.server_restarted", server=watch.name, attempts=watch.attempts + 1,
             down_seconds=round(time.monotonic() - watch.down_since, 2))
    watch.down_since, watch.attempts, watch.last_error = None, 0, None


def _stop_all(children: Sequence[RoleProcess]) -> None:
    running = [c.process for c in children if c.process is not None and c.process.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for proc in running:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("supervisor.child_killed", pid=proc.pid, reason="ignored SIGTERM")
            proc.kill()
            proc.wait()
    log.info("supervisor.stopped", children=len(children))


def child_environment(nats_url: str, database_url: str, read_urls: Sequence[str] = ()) -> dict[str, str]:
    """The environment a role child needs: this one, with the servers pinned (so it starts none), and the
    query role's read replicas when there are any."""
    env = {**os.environ, "PAMLEDGER_NATS_URL": nats_url, "PAMLEDGER_DATABASE_URL": database_url}
    if read_urls:
        env["PAMLEDGER_DATABASE__READ_URLS"] = json.dumps(list(read_urls))
    return env

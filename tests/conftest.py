"""Shared fixtures: a private NATS and Postgres per test session, a fresh database and fresh stream
names per test module, and the service running in-process against them.

Set PAMLEDGER_TEST_NATS_URL and PAMLEDGER_TEST_DATABASE_URL (a superuser URL) to use servers you run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.migrations import migrate
from infra.settings import AuthSettings, IndexerSettings, MetricsSettings, QuerySettings, Settings, WriterSettings
from tests.profile_claims import (  # noqa: F401 - the claimed-profile gate's hooks (docs/implementation-report.md)
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"
PAMSPEC = SHARED / "pamspec"
TEMPLATE_DB = "pamledger_template"


@dataclass(frozen=True)
class Servers:
    nats_url: str
    admin_url: str  # superuser URL of the `postgres` database

    def database_url(self, name: str) -> str:
        return self.admin_url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    nats_url = os.environ.get("PAMLEDGER_TEST_NATS_URL")
    admin_url = os.environ.get("PAMLEDGER_TEST_DATABASE_URL")
    handles: list[Any] = []
    if not (nats_url and admin_url):
        from local_servers.launch import start_nats, start_postgres

        root = tmp_path_factory.mktemp("servers")
        nats = start_nats(root / "nats")
        handles.append(nats)
        postgres = start_postgres(root / "postgres")
        handles.append(postgres)
        nats_url, admin_url = nats.url, postgres.url
    found = Servers(nats_url, admin_url)
    _make_template(found)
    try:
        yield found
    finally:
        for handle in reversed(handles):
            # destroy() also removes the root-only mirror of the Postgres data; stop() keeps it.
            getattr(handle, "destroy", handle.stop)()


def _make_template(servers: Servers) -> None:
    with psycopg.connect(servers.admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    migrate(servers.database_url(TEMPLATE_DB))


def fresh_database(servers: Servers, label: str) -> str:
    """A new database cloned from the migrated template; returns its URL."""
    name = f"t_{label}_{uuid.uuid4().hex[:8]}".lower()
    with psycopg.connect(servers.admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}")
    return servers.database_url(name)


ROOT = Path(__file__).resolve().parents[1]


def service_environment(env: "Env", database_url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a `pamledger` process serving `env` (its servers, subject prefix and stream, its auth
    mode and token files), with JSON logs; `extra` adds or overrides variables."""
    auth = env.settings.auth
    files = {f"PAMLEDGER_AUTH__{name.upper()}": str(path) for name, path in (
        ("admin_token_file", auth.admin_token_file), ("service_token_file", auth.service_token_file)) if path}
    return {**os.environ, **files, "PAMLEDGER_NATS_URL": env.nats_url,
            "PAMLEDGER_DATABASE_URL": database_url or env.database_url,
            "PAMLEDGER_SUBJECT_PREFIX": env.settings.subject_prefix, "PAMLEDGER_STREAM_NAME": env.settings.stream_name,
            "PAMLEDGER_INDEXER__DEFAULT_SPACE": env.settings.indexer.default_space,
            "PAMLEDGER_AUTH__MODE": env.settings.auth.mode,
            "PAMLEDGER_METRICS__PORT": str(env.settings.metrics.port),
            **({"PAMLEDGER_PARTITIONS": str(env.settings.partitions)} if env.settings.partitions != 1 else {}),
            **({"PAMLEDGER_WRITER__ERASURE_JOURNAL": str(env.settings.writer.erasure_journal)}
               if env.settings.writer.erasure_journal else {}),
            **({"PAMLEDGER_QUERY__CURSOR_KEYS": str(env.settings.query.cursor_keys)}
               if env.settings.query.cursor_keys else {}),
            "PAMLEDGER_LOG_FORMAT": "json", **extra}


def run_cli(env: "Env", *args: str, database_url: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m pamledger ARGS` against `env` (or another database of its servers), output captured."""
    return subprocess.run([sys.executable, "-m", "pamledger", *args], cwd=ROOT,
                          env=service_environment(env, database_url), capture_output=True, text=True, timeout=120)


JOURNALS = Path(tempfile.gettempdir()) / "pamledger-test-journals"
TEST_SPACE = "hashing-16"  # the indexer's default space in tests: no model to load


def fresh_settings(label: str, **overrides: Any) -> Settings:
    """Subject prefix and stream name of their own, so modules never see each other's traffic; an indexer
    defaults to a small feature-hashing space (TEST_SPACE) instead of the model."""
    tag = f"{label}_{uuid.uuid4().hex[:6]}".lower()
    overrides.setdefault("indexer", IndexerSettings(default_space=TEST_SPACE))
    # Auth is off unless a module asks (tests/integration/test_auth*.py run it enforced, with real tokens).
    overrides.setdefault("auth", AuthSettings(mode="off"))
    # Each module's erasure journal of its own (the default is the state dir's, shared by every module here).
    overrides.setdefault("writer", WriterSettings(erasure_journal=JOURNALS / f"{tag}.jsonl"))
    overrides.setdefault("metrics", MetricsSettings(port=0))  # no side door unless a test asks (ports are shared)
    # Cursor keys of the module's own (a state dir given by the module holds them, as in production).
    if "state_dir" not in overrides:
        overrides.setdefault("query", QuerySettings(cursor_keys=JOURNALS / f"{tag}-cursor-keys.json"))
    return Settings(subject_prefix=f"pam_{tag}", stream_name=f"PAM_{tag.upper()}", **overrides)


@dataclass
class Env:
    """One module's world: servers, its own database and settings."""

    servers: Servers
    database_url: str
    settings: Settings
    nats_server: Any = None  # the NATS of its own, when it has one (locked_env)

    @property
    def nats_url(self) -> str:
        return self.servers.nats_url


@pytest.fixture(scope="module")
def env(servers: Servers, request: pytest.FixtureRequest) -> Env:
    label = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")[:20]
    return Env(servers, fresh_database(servers, label), fresh_settings(label))


ROLES = ("writer", "query", "projector", "gateway")  # the indexer runs where a test asks for it (roles=)


@contextlib.asynccontextmanager
async def serving(env: Env, ready: tuple[str, ...] = ROLES, timeout: float = 60.0, authorizer: Any = None,
                  policy: Any = None, roles: tuple[str, ...] = ROLES) -> AsyncIterator[Any]:
    """The service's `roles` (query, writer, relay, projector, gateway; the indexer when asked) as a task in
    this event loop, ready once the `ready` roles answer their status; yields a client that does not retry.
    Why not the indexer by default: it appends its own ledger entries (space registrations, embedding
    records in each scope), which tests of other parts would have to step around."""
    from pamledger.runtime import run_service
    from pamledger_client.client import MemoryClient

    stop = asyncio.Event()
    task = asyncio.create_task(run_service(env.settings, env.nats_url, env.database_url, stop, authorizer,
                                            roles=roles, policy=policy))
    client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix)
    client.retries = 0
    try:
        await wait_for(lambda: answers(client, ready), timeout=timeout)
        yield client
    finally:
        await client.close()
        stop.set()
        await task


@contextlib.asynccontextmanager
async def running_service(env: Env, authorizer: Any = None, policy: Any = None) -> AsyncIterator[None]:
    """The whole service, once every role answers."""
    async with serving(env, ROLES, 30.0, authorizer, policy):
        yield


async def answers(client: Any, roles: tuple[str, ...] = ROLES) -> bool:
    """Every role of `roles` answers its status subject (the writer, projector and gateway once they lead).
    A refusal answers too (auth enforced, and this client holds no token the service knows)."""
    from pamledger_client.client import PamspecError

    try:
        for role in roles:
            try:
                await client.status(role)
            except PamspecError as exc:
                if exc.code != "access_denied":
                    raise
        return True
    except PamspecError:
        return False


async def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll an (async or sync) predicate until it is truthy; fail loudly after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


@pytest.fixture(scope="module")
async def service(env: Env) -> AsyncIterator[Env]:
    async with running_service(env):
        yield env


@pytest.fixture(scope="module")
async def client(service: Env) -> AsyncIterator[Any]:
    from pamledger_client.client import MemoryClient

    c = await MemoryClient.connect(service.nats_url, service.settings.subject_prefix)
    yield c
    await c.close()


ACTOR = {"actor_id": "actor:agent:tester", "actor_kind": "agent"}
PROVENANCE = {"provenance_id": "prov:test:1", "actor": ACTOR, "activity": "test"}


def pamspec_dir() -> Path:
    """The official PAMSPEC files, or skip (saying why) where ../shared is absent."""
    if not PAMSPEC.is_dir():
        pytest.skip(f"PAMSPEC files not found at {PAMSPEC} (../shared is absent)")
    return PAMSPEC


@contextlib.asynccontextmanager
async def locked_env(servers: Servers, state: Path, label: str) -> AsyncIterator[Env]:
    """An Env whose NATS runs the configuration `pamledger up` generates with auth enforced (users and
    permissions per credential: docs/security.md "Transport"), its tokens in `state`; the session's Postgres."""
    import json

    from infra.endpoints import SERVERS_FILE
    from local_servers.launch import start_nats
    from pamledger.auth import prepare_credentials
    from pamledger.nats_users import prepare_nats_config, sync_nats_users

    settings = fresh_settings(label, state_dir=state, auth=AuthSettings(mode="enforce"))
    database_url = fresh_database(servers, label)
    prepare_credentials(settings)
    prepare_nats_config(settings)
    server = start_nats(state / "nats")
    # What `pamledger up` records: the service then knows this NATS is its own (and whom to make reload).
    (state / SERVERS_FILE).write_text(json.dumps({"nats_url": server.url, "nats_port": server.port,
                                                  "nats_pid": server.pid}))
    await sync_nats_users(settings, database_url)
    saved = os.environ.get("PAMLEDGER_STATE_DIR")
    os.environ["PAMLEDGER_STATE_DIR"] = str(state)  # serving()'s own client logs in with this admin token
    try:
        yield Env(Servers(server.url, servers.admin_url), database_url, settings, server)
    finally:
        if saved is None:
            os.environ.pop("PAMLEDGER_STATE_DIR", None)
        else:
            os.environ["PAMLEDGER_STATE_DIR"] = saved
        server.stop()


def enforced_env(servers: Servers, state: Path, label: str, **auth: Any) -> Env:
    """A module's world with auth enforced on the shared (open) NATS: its tokens in `state`."""
    settings = fresh_settings(label, auth=AuthSettings(mode="enforce", admin_token_file=state / "admin.token",
                                                       service_token_file=state / "service.token", **auth))
    return Env(servers, fresh_database(servers, label), settings)


async def token_client(env: Env, token: str | None) -> Any:
    """A client sending `token` (None: no credential at all), no retries."""
    from pamledger_client.client import MemoryClient

    client = await MemoryClient.connect(env.nats_url, env.settings.subject_prefix, token=token or "")
    client.token = token  # "" above keeps connect from finding a token elsewhere; None sends none
    client.retries = 0
    return client


async def admin_client(env: Env) -> Any:
    """A client with the module's administrative token, once the service answers it."""
    from authz.bootstrap import admin_token_path, read_token

    token = read_token(admin_token_path(env.settings))
    assert token is not None, "no admin token: is the service serving this env?"
    client = await token_client(env, token)
    await wait_for(lambda: can_query(client, "system:pamledger"), timeout=30)
    return client


async def can_query(client: Any, scope_id: str) -> bool:
    """The client's query of `scope_id` is answered (its token and grant are in effect)."""
    from pamledger_client.client import PamspecError

    try:
        await client.query(scope_id, limit=1)
        return True
    except PamspecError:
        return False


@contextlib.contextmanager
def pamledger_run(tmp_path: Path, **env: str) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """A real `pamledger run` on a state dir of its own (no PAMLEDGER_ variable of ours leaks in; `env` adds
    some): (process, state dir, log). Interrupted at the end, then its state dir cleaned."""
    from local_servers.launch import clean

    state, log_path = tmp_path / "state", tmp_path / "run.log"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PAMLEDGER_")}
    environment.update(PAMLEDGER_STATE_DIR=str(state), PAMLEDGER_LOG_FORMAT="json", **env)
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pamledger", "run"], cwd=ROOT, env=environment,
                                stdout=log, stderr=log)
    try:
        yield proc, state, log_path
    finally:
        stop_process(proc, signal.SIGINT, timeout=90)
        clean(state)


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Signal a child that still runs and wait for it; kill it when it outlives `timeout`."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def take(subscription: Any, count: int, timeout: float = 60) -> list[dict[str, Any]]:
    """The next `count` events of a subscription (its iterator), within `timeout` seconds."""
    got: list[dict[str, Any]] = []

    async def collect() -> None:
        async for event in subscription:
            got.append(event)
            if len(got) >= count:
                return

    await asyncio.wait_for(collect(), timeout)
    return got


@contextlib.contextmanager
def primary_and_replica(root: Path, database: str) -> Iterator[dict[str, Any]]:
    """A Postgres primary of a module's own (the session's serves every module) with `database` made and
    migrated, and a streaming replica of it: {"primary", "replica", "root"}. Whatever server stands under
    "primary" and "replica" at the end (a test may restart one in place) is destroyed."""
    from local_servers.launch import free_port
    from local_servers.postgres_server import launch_postgres, launch_replica

    primary = launch_postgres(root / "primary", free_port())
    handles: dict[str, Any] = {"primary": primary, "root": root}
    try:
        with psycopg.connect(primary.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {database}")
        migrate(in_database(primary.url, database))
        handles["replica"] = launch_replica(primary.port, root / "replica", free_port())
        yield handles
    finally:
        for name in ("replica", "primary"):
            if name in handles:
                handles[name].destroy()


def in_database(url: str, database: str) -> str:
    """A server's URL naming another database of it."""
    return url.rsplit("/", 1)[0] + "/" + database


@contextlib.contextmanager
def nats_cluster(root: Path, nodes: int = 3) -> Iterator[list[Any]]:
    """A JetStream cluster of `nodes` on loopback (local_servers.nats_cluster), stopped at the end."""
    from local_servers.launch import free_port
    from local_servers.nats_cluster import start_cluster

    started = start_cluster(root, nodes, free_port)
    try:
        yield started
    finally:
        for node in started:
            node.stop()

"""Running service roles in this process: query answers from every instance; the writer, projector and
gateway each lead only while this process holds their partition's advisory lock.

`pamledger run` gives each role its own process (pamledger/supervisor.py); tests run them all in one.
A second instance of a role is a hot standby: it polls the lock, and when the leader's database
session ends (crash, SIGKILL, network loss) Postgres releases the lock and the standby takes over
within `lock_poll_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

from embedding.store import INDEX_CHECKPOINT, INDEX_NOTIFY_CHANNEL
from indexer.role import run_beside_follower
from indexer.step import INDEXER, indexer_spec
from infra import locks, tracing
from infra.cleanup import run_to_end
from infra.follower import EventFailed, Follower, FollowerSpec
from infra.requester import CommandRequester
from infra.nats_log import ConnectionLog
from infra.metrics import FOLLOWER_POSITION, FOLLOWER_STUCK, leading, leads
from infra.nats_raw import RawClient, connect_raw
from infra.nats_servers import stream_replicas
from infra.probes import Probes, serving_probes
from infra.request_shell import AllowAll, DelegationGate, DenialSink, Policy
from infra.partitions import partition_stream
from infra.settings import Settings
from infra.role_failures import RoleFailures
from infra.status import status_reply
from infra.stuck import StuckState, describe
from pamledger_client.protocol.subjects import status_subject
from pamledger_client.protocol.tasks import stop_task
from pamledger.auth import auth_for, delegated_reads
from pamledger.followers import FOLLOWERS
from pamledger.leadership import partition_lock, role_failures, wait_for_lock
from pamledger.writer_role import lead_forever
from pamledger.nats_users import nats_is_ours, nats_users, operator_nats_options
from pamledger.supervisor import ROLES
from query.cursor_keys import CursorSigner, cursor_keys_path
from query.replicas import ReplicaReads
from query.search import CheckpointWatcher
from query.partitions import ScopePositions
from query.service import QueryService
from retention.evaluator import run_rounds
from subscriptions.filters import Authorizer
from subscriptions.gateway import Gateway
from subscriptions.store import LeadershipLost, SubscriptionStore

log = structlog.get_logger(__name__)


async def connect_nats(url: str, name: str, settings: Settings | None = None) -> RawClient:
    """A NATS connection that reconnects forever (the service outlives NATS restarts), logging one line
    per state change (infra.nats_log). A RawClient, so a role may take a subscription's deliveries as raw
    bytes (writer, projector and query do). With `settings`, it logs in as the service user of the state
    dir when there is one (pamledger.nats_users) and verifies TLS against auth.nats_tls_ca."""
    events = ConnectionLog(name)
    options: dict[str, Any] = operator_nats_options(settings) if settings is not None else {}
    nc = await connect_raw(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.25,
                           connect_timeout=5, pending_size=64 * 1024 * 1024, **events.callbacks(), **options)
    events.client = nc
    return nc


async def run_service(settings: Settings, nats_url: str, database_url: str, stop: asyncio.Event,
                      authorizer: Authorizer | None = None, roles: Sequence[str] = ROLES,
                      policy: Policy | None = None) -> None:
    """Serve `roles` in this process until `stop` is set. Each role has its own NATS connection, so one
    role's backlog (or a slow-consumer cut-off) never queues behind another's. `authorizer` is the
    per-event authorization seam of Subscribe; `policy` the per-request policy port of the writer, the query
    service and the gateway (infra.request_shell). Both default to what settings.auth says (pamledger.auth):
    credentials and grants when enforced, everything allowed when off."""
    connections: list[NATS] = []
    tasks: list[asyncio.Task[None]] = []
    tracing.configure(settings.tracing.endpoint, list(roles))  # off without an endpoint: nothing is set up
    auth = auth_for(settings, database_url)
    policy = policy or auth.policy
    authorizer = authorizer or auth.authorizer
    if auth.registry is not None and roles:  # every role answers requests: status at least (infra.status)
        tasks.append(asyncio.create_task(auth.registry.run()))
    registry = auth.registry
    if registry is not None and "writer" in roles and nats_is_ours(settings, nats_url):
        # tokens issued/revoked reach NATS's users (auth off: no users to keep)
        tasks.append(asyncio.create_task(nats_users(settings).run(
            lambda: registry.grants if registry.loaded.is_set() else None, settings.auth.refresh_seconds)))
    query: QueryService | None = None
    pool: AsyncConnectionPool[Any] | None = None
    replicas: ReplicaReads | None = None
    probes = Probes(database_url, lambda: {"roles": list(roles), "leading": leading(roles)})

    async def connection(role: str) -> RawClient:
        nc = await connect_nats(nats_url, f"pamledger-{role}", settings)
        connections.append(nc)
        probes.add(f"nats.{role}", lambda: None if nc.is_connected else "NATS connection not connected")
        return nc

    side_door = serving_probes(settings.metrics.host, probe_port(settings, roles), probes)
    await side_door.__aenter__()
    try:
        if "query" in roles:
            # check: a connection that died with its server (a Postgres restart) is found out and replaced
            # when handed out, not used for one more failed request each.
            pool = AsyncConnectionPool(database_url, min_size=1, max_size=4, open=False,
                                       kwargs={"autocommit": True}, check=AsyncConnectionPool.check_connection)
            await pool.open()
            if settings.database.read_urls:  # scans on streaming replicas, fenced (docs/scaling.md)
                replicas = ReplicaReads(pool, settings.database)
                await replicas.start()
            # Each partition's projection and index checkpoints (query min_sequence, search's on the index).
            positions = ScopePositions.single(settings.partition, CheckpointWatcher(), CheckpointWatcher(
                INDEX_CHECKPOINT, INDEX_NOTIFY_CHANNEL)) if settings.partitions == 1 \
                else ScopePositions.partitioned(settings.partitions)
            first = next(iter(positions.positions.values()))
            watcher, index_watcher = first.watcher, first.index_watcher
            query_nc = await connection("query")
            query = QueryService(query_nc, pool, settings.subject_prefix, watcher, settings.query,
                                 settings.partition, policy, index_watcher,
                                 auth.denials(query_nc, settings.subject_prefix),
                                 delegated_reads(auth, query_nc, settings.subject_prefix),
                                 cursor_signer(settings), replicas, positions)
            await query.start()
            for each in positions.watchers():
                tasks.append(asyncio.create_task(each.run(database_url)))
        if "writer" in roles:
            stream_copies = stream_replicas(nats_url, settings.nats.stream_replicas)
            tasks.append(asyncio.create_task(lead_forever(settings, await connection("writer"), database_url,
                                                          policy, stream_copies)))
        for spec in FOLLOWERS:
            if spec.name in roles:
                follower_nc = await connection(spec.name)
                if spec.name == INDEXER.name:
                    spec = indexer_spec(settings.indexer, settings.indexer.max_batch)
                    requester = CommandRequester(follower_nc, settings.subject_prefix, retries=0,
                                                 token=auth.service_token)
                    tasks.append(asyncio.create_task(run_beside_follower(requester, database_url, settings.indexer)))
                tasks.append(asyncio.create_task(follow_forever(settings, follower_nc, database_url, spec, probes,
                                                                policy)))
        if "retention" in roles:  # optional: settings.retention.enabled adds it to `all`
            tasks.append(asyncio.create_task(retention_forever(settings, await connection("retention"), database_url,
                                                               auth.service_token, policy)))
        if "gateway" in roles:
            gateway_nc = await connection("gateway")
            tasks.append(asyncio.create_task(
                gateway_forever(settings, gateway_nc, database_url, authorizer, policy,
                                auth.denials(gateway_nc, settings.subject_prefix), auth.service_token,
                                delegated_reads(auth, gateway_nc, settings.subject_prefix))))
        log.info("service.roles", roles=list(roles), pid=os.getpid())
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            failure = await stop_task(task)
            if failure is not None:
                log.error("service.role_failed_at_stop", reason=describe(failure))  # first line only: no DETAIL data
        if query is not None:
            await query.stop()
        if replicas is not None:
            await replicas.close()
        if pool is not None:
            await pool.close()
        # Not drain(): draining would wait on subscriptions still being delivered to. Replies are already out;
        # flush what is buffered, then close.
        for nc in connections:
            with contextlib.suppress(Exception):
                await nc.flush(timeout=2)
            await nc.close()
        await side_door.__aexit__(None, None, None)
        await asyncio.to_thread(tracing.shutdown)  # the spans still buffered go out (nothing when off)
        log.info("service.stopped", roles=list(roles))


def _position_of(follower: Follower) -> Callable[[], float]:
    return lambda: float(follower.applied)


# A process serving one role serves its probes at the base port plus the role's offset (infra.probes).
PROBE_OFFSETS = {"writer": 0, "query": 1, "projector": 2, "indexer": 3, "gateway": 4, "retention": 5}


def cursor_signer(settings: Settings) -> CursorSigner:
    return CursorSigner(cursor_keys_path(settings), settings.query.cursor_key_grace_seconds)


def probe_port(settings: Settings, roles: Sequence[str]) -> int:
    """Where this process's /metrics, /healthz and /readyz listen (0: off)."""
    base = settings.metrics.port
    if base <= 0:
        return 0
    return base + PROBE_OFFSETS.get(roles[0], 0) if len(roles) == 1 else base


async def follow_forever(settings: Settings, nc: RawClient, database_url: str, spec: FollowerSpec,
                         probes: Probes | None = None, policy: Policy | None = None) -> None:
    """Lead the `spec` follower of the settings' partition, or (several partitions) of every partition whose
    lock this process can take: each partition's follower has its own lock, checkpoint and stream."""
    if settings.partitions == 1:
        await follow_partition_forever(settings, nc, database_url, spec, settings.partition, probes, policy)
        return
    held: set[int] = set()  # the partitions this process leads the follower of: its share (writer.partition_share)
    await asyncio.gather(*(follow_partition_forever(settings, nc, database_url, spec, partition, probes, policy,
                                                    held) for partition in range(settings.partitions)))


async def follow_partition_forever(settings: Settings, nc: RawClient, database_url: str, spec: FollowerSpec,
                                   partition: int, probes: Probes | None = None, policy: Policy | None = None,
                                   held: set[int] | None = None) -> None:
    """Lead the partition's `spec` follower (its own advisory lock; `held`: this process's share of the
    partitions, pamledger.leadership), reconnecting when the database goes away. Its stuck state outlives
    reconnects, so status keeps saying since when an event has been failing."""
    stuck = StuckState(settings.follower.retry_first_seconds, settings.follower.retry_max_seconds)
    name = spec.name if partition == 0 else f"{spec.name}.p{partition}"  # status subject, metrics, probes
    failures = role_failures(settings, name)
    FOLLOWER_STUCK.labels(name).set_function(lambda: 1 if stuck.current is not None else 0)
    if probes is not None:
        probes.add(f"{name}.stuck", lambda: None if stuck.current is None else
                   f"stuck at ledger sequence {stuck.current.sequence}")
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                # What a follower derives is disposable and its checkpoint commits with its rows: a commit
                # lost in a crash is simply re-applied from the checkpoint, so it need not wait for fsync
                # (and must not compete with the writer's).
                await conn.execute("SET synchronous_commit = off")
                # A retry of a stuck event takes the lock again: said once, when the state changed.
                quiet = stuck.current is not None or failures.attempts > 0
                lock = spec.lock_key(partition)
                async with partition_lock(conn, lock, settings, spec.name, partition, held, quiet), \
                        answering_status(nc, settings, name, lambda: {"stuck": stuck.report()}, policy,
                                         lambda: stuck.current is None, partition):
                    try:
                        with failures.running():
                            follower = Follower(
                                spec, nc, conn, partition_stream(settings.stream_name, partition),
                                settings.subject_prefix, partition, settings.follower, stuck=stuck,
                                connect=lambda: psycopg.AsyncConnection.connect(database_url, autocommit=True))
                            FOLLOWER_POSITION.labels(name).set_function(_position_of(follower))
                            leads(name, True)
                            try:
                                await follower.run()
                            finally:
                                leads(name, False)
                                await run_to_end(follower.close())  # its prepare connection, closed for sure
                    except EventFailed:  # logged once per state change; wait (still leading), then retry
                        await asyncio.sleep(stuck.delay())
                        continue
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            await asyncio.sleep(failures.failed(exc, expected=True))
        except Exception as exc:  # noqa: BLE001 - restart from the checkpoint rather than stop following
            await asyncio.sleep(failures.failed(exc, expected=False))
        else:
            await asyncio.sleep(settings.writer.lock_poll_seconds)


async def gateway_forever(settings: Settings, nc: NATS, database_url: str, authorizer: Authorizer,
                          policy: Policy | None = None, denials: DenialSink | None = None,
                          service_token: str | None = None, delegations: DelegationGate | None = None) -> None:
    """Lead the settings' partition's Subscribe gateway, or (several partitions) the gateway of every
    partition whose lock this process can take: each has its own lock, feed, stream and subscriptions, and
    partition 0's routes the others' requests to them (subscriptions.routing). `delegations`: subscriptions
    opened under a delegation have it exercised (where auth is on)."""
    if settings.partitions == 1:
        await gateway_partition_forever(settings, nc, database_url, authorizer, settings.partition, policy, denials,
                                        service_token, delegations)
        return
    held: set[int] = set()  # the partitions this process leads the gateway of: its share (writer.partition_share)
    await asyncio.gather(*(gateway_partition_forever(settings, nc, database_url, authorizer, partition, policy,
                                                     denials, service_token, delegations, held)
                           for partition in range(settings.partitions)))


async def gateway_partition_forever(settings: Settings, nc: NATS, database_url: str, authorizer: Authorizer,
                                    partition: int, policy: Policy | None = None, denials: DenialSink | None = None,
                                    service_token: str | None = None, delegations: DelegationGate | None = None,
                                    held: set[int] | None = None) -> None:
    """Lead one partition's Subscribe gateway (its own advisory lock; `held`: this process's share of the
    partitions, pamledger.leadership), taking its subscriptions over again after a failure or a lost lock."""
    name = "gateway" if settings.partitions == 1 or partition == 0 else f"gateway.p{partition}"  # as Gateway.role
    failures = role_failures(settings, name)
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                key = locks.gateway_key(partition)
                async with partition_lock(conn, key, settings, "gateway", partition, held, failures.attempts > 0):
                    store = SubscriptionStore(conn, database_url, key, partition, settings.writer.lock_poll_seconds)
                    try:
                        with failures.running():
                            leads(name, True)  # answers status.gateway (status.gateway.p<p>) once serving
                            await Gateway(settings, nc, store, authorizer, policy, denials, service_token,
                                          delegations, partition).serve()
                    finally:
                        leads(name, False)
                        await run_to_end(store.close())  # a session it reconnected holds the lock: closed for sure
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            await asyncio.sleep(failures.failed(exc, expected=True))
            continue
        except LeadershipLost as exc:
            log.warning("gateway.leadership_lost", reason=str(exc), partition=partition)
        except Exception as exc:  # noqa: BLE001 - restart and take the subscriptions over again
            await asyncio.sleep(failures.failed(exc, expected=False))
            continue
        await asyncio.sleep(settings.writer.lock_poll_seconds)


async def retention_forever(settings: Settings, nc: RawClient, database_url: str, service_token: str | None,
                            policy: Policy | None = None) -> None:
    """Lead the partition's retention evaluator (its own advisory lock, so one instance proposes): a round
    at once, then every retention.every_seconds; after a failure, again with the roles' backoff."""
    failures = role_failures(settings, "retention")
    last: dict[str, Any] = {}
    requester = CommandRequester(nc, settings.subject_prefix, token=service_token)
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
                await wait_for_lock(conn, locks.retention_key(settings.partition), settings, "retention",
                                     quiet=failures.attempts > 0)
                async with answering_status(nc, settings, "retention", lambda: {"last_round": dict(last)}, policy):
                    with failures.running():
                        await run_rounds(conn, requester, settings.retention, last)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            await asyncio.sleep(failures.failed(exc, expected=True))
        except Exception as exc:  # noqa: BLE001 - the writer away, a bug: come back with backoff
            await asyncio.sleep(failures.failed(exc, expected=False))


@contextlib.asynccontextmanager
async def answering_status(nc: NATS, settings: Settings, role: str,
                           details: Callable[[], dict[str, Any]] | None = None, policy: Policy | None = None,
                           ok: Callable[[], bool] | None = None, partition: int | None = None) -> AsyncIterator[None]:
    """While this process leads `role`, `{prefix}.status.{role}` answers with its pid (operators and the
    crash tests use it to find the process to stop) and the role's `details` (a follower's `stuck`); with
    auth enforced (`policy`), the pid and details to an administrator only, health to any caller (infra.status)."""
    answering = policy or AllowAll()

    async def respond(msg: Msg) -> None:
        health = {"role": role, "leader": True, "ok": ok() if ok is not None else True}
        await msg.respond(status_reply(answering, msg.subject, msg.headers, health, lambda: {
            "partition": settings.partition if partition is None else partition, "pid": os.getpid(),
            **(details() if details is not None else {})}))

    sub = await nc.subscribe(status_subject(settings.subject_prefix, role), cb=respond)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()

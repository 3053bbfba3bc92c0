"""Service settings (pydantic-settings, PAMLEDGER_ prefix), built in each main() and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.locks import MAX_PARTITIONS
from pamledger_client.protocol.local import DEFAULT_STATE_DIR
from pamledger_client.protocol.subjects import DEFAULT_PREFIX


class _Group(BaseModel):
    """A nested group of settings: a name it does not know (a misspelt PAMLEDGER_<GROUP>__<NAME>) is refused at
    start, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class WriterSettings(_Group):
    """The single writer: batching, its bounded head-state cache, the relay, and the chain check before it appends."""

    max_batch: int = Field(default=1024, ge=1)
    head_cache_size: int = Field(default=100_000, ge=1)
    max_payload_bytes: int = Field(default=524_288, ge=1024)
    lock_poll_seconds: float = Field(default=0.5, gt=0)
    # Every leading role (writer, projector, gateway): a run that fails is retried after a wait doubling from
    # lock_poll_seconds up to 10x it; only a run that lasts this long counts as serving again (backoff afresh).
    role_healthy_seconds: float = Field(default=30.0, gt=0)
    # With several partitions: how many partitions a process leads at once in each role (writer, projector,
    # indexer, gateway; 0: every free one). Past its share it takes a partition only once it stayed free for
    # TAKEOVER_POLLS polls (pamledger.leadership), so processes started together split the partitions, and a
    # dead one's are still taken over.
    partition_share: int = Field(default=0, ge=0)
    # The relay's wait for JetStream to acknowledge a run; past it (or on a reconnect) it resyncs.
    relay_publish_timeout_seconds: float = Field(default=5.0, gt=0)
    # The chain rows it checks link and recompute before it appends (on start, and while broken).
    tail_check_rows: int = Field(default=16, ge=1, le=100_000)
    # How long it waits for JetStream when it checks that the stream holds no sequence the ledger lacks (on
    # start, and while refused or unchecked); past it, it appends (Postgres decides) and checks again after
    # as long, before a later batch.
    stream_check_seconds: float = Field(default=2.0, gt=0, le=60)
    # Where the writer records every erasure outside the database, for `pamledger restore` to erase again
    # what was erased after a backup (command_handler.erasure_journal). Unset: <state_dir>/erasure-journal.jsonl.
    # Put it on another disk than the database to survive the loss of both.
    erasure_journal: Path | None = None


class QuerySettings(_Group):
    """The query role (read, history, query): what one process takes on before it refuses."""

    max_request_bytes: int = Field(default=65_536, ge=1024, le=1_048_576)
    # Requests answered at once by one process; past it a request is refused as service_unavailable.
    max_in_flight: int = Field(default=256, ge=1, le=100_000)
    # At stop, how long requests in flight may finish before they are cancelled.
    stop_grace_seconds: float = Field(default=2.0, ge=0, le=60)
    # Search: a scope with at most this many vectors in the space is searched exactly (every vector
    # compared); a larger one through the HNSW index with iterative scans, then re-ranked exactly.
    search_exact_threshold: int = Field(default=3_000, ge=0, le=10_000_000)  # exact ~6.7 ms per 1,000 (bench)
    # HNSW candidate list size (pgvector hnsw.ef_search): higher finds truer neighbours, slower.
    search_ef_search: int = Field(default=400, ge=1, le=1000)  # 0.99 recall@10 in a 100k scope: python -m bench search
    # A scope above the exact threshold but at most this large uses search_mid_ef_search instead: in a scope
    # that is a small share of the table, ef 400 finds 0.92-0.95 of the true neighbours (3k-10k among 200k),
    # ef 1000 0.95-0.98 at about twice the time (python -m bench search --mid). 0 turns it off.
    search_mid_threshold: int = Field(default=20_000, ge=0, le=10_000_000)
    search_mid_ef_search: int = Field(default=1000, ge=1, le=1000)
    # How many index tuples one iterative HNSW scan may visit before it gives up (hnsw.max_scan_tuples):
    # bounds the work of a filter that almost nothing passes.
    search_max_scan_tuples: int = Field(default=20_000, ge=1, le=10_000_000)
    # The keys that sign query cursors (query.cursor_keys). Unset: <state_dir>/cursor-keys.json, made at start.
    cursor_keys: Path | None = None
    # How long a cursor signed with a rotated-out key is still accepted (`pamledger cursor-keys rotate`).
    cursor_key_grace_seconds: float = Field(default=86_400.0, ge=0, le=90 * 86_400)


class DatabaseSettings(_Group):
    """Where the query role reads besides the primary (`database_url`): streaming replicas (docs/scaling.md,
    "Postgres: read replicas"). Empty: every read on the primary, as before."""

    # Hot-standby replicas of the primary, each a URL of the same database (`pamledger up --pg-replica` records
    # a local one). The query role's scans (query, search, related, events, export, snapshots) go to one of them.
    read_urls: list[str] = Field(default_factory=list)
    # How long a request waits for the replica to replay the primary's position at the request's arrival (its
    # fence); past it the primary answers and the replica counts as behind. Also how long it waits for a
    # replica connection.
    replica_wait_ms: int = Field(default=200, ge=1, le=60_000)
    # A replica found away (no connection) or behind gets no request for this long; then it is tried again.
    replica_retry_seconds: float = Field(default=1.0, gt=0, le=3600)
    # Connections to each replica at most (the primary's query pool has 4).
    replica_pool_size: int = Field(default=4, ge=1, le=100)


class GatewaySettings(_Group):
    """The Subscribe gateway: its database checks, position flushes, per-subscription buffers and feed."""

    database_check_seconds: float = Field(default=1.0, gt=0)
    # How often acknowledged positions go to Postgres: a crash re-delivers at most this much.
    flush_seconds: float = Field(default=0.5, gt=0, le=60)
    # Live events held per subscription while it catches up or sits at max_unacked; past it they are
    # dropped and read again from the stream.
    live_buffer_events: int = Field(default=20_000, ge=1, le=10_000_000)
    # JetStream deletes a subscription's catch-up reader nobody pulled from for this long.
    reader_idle_seconds: float = Field(default=120.0, ge=1, le=86_400)
    # With no push subscription for this long the partition feed stops reading the stream.
    feed_pause_after_seconds: float = Field(default=10.0, gt=0, le=86_400)


class FollowerSettings(_Group):
    """Stream followers (every FollowerSpec: the projector today; each reads this one group): batching, acknowledgements, consumer checks, and how they retry
    an event they cannot apply (they never skip it). The gateway's feed and pushes use the retry pair."""

    retry_first_seconds: float = Field(default=0.5, gt=0)
    retry_max_seconds: float = Field(default=30.0, gt=0)
    # Events gather this long into one transaction under load: it bounds the commit rate at 1/linger.
    linger_seconds: float = Field(default=0.01, ge=0, le=1)
    # Events the server may push ahead of the last acknowledgement (acks go every quarter of it).
    max_ack_pending: int = Field(default=20_000, ge=4, le=1_000_000)
    ack_every_seconds: float = Field(default=1.0, gt=0, le=60)
    # When nothing arrives for this long, check that the consumer still exists (else re-create it).
    idle_check_seconds: float = Field(default=2.0, gt=0, le=300)


class IndexerSettings(_Group):
    """The indexer role: the space it registers (and makes the default when none is) on start, how it embeds,
    and how its outbox of ledger entries reaches the writer."""

    # "minilm" (the offline model) or "hashing-N" (feature hashing, N dimensions: tests, no model).
    default_space: str = Field(default="minilm", pattern=r"^(minilm|hashing-([1-9][0-9]{0,2}|1[0-9]{3}|2000))$")
    # Threads the model may use per process (0: onnxruntime decides, a spinning thread per core). One by default,
    # so a busy indexer leaves the other core to the writer (issue [P1]).
    model_threads: int = Field(default=1, ge=0, le=64)
    # How much lower than the other roles an indexer-only process runs (os.nice; 0: the same priority). `run`
    # gives the indexer a process of its own, so the writer wins the CPU when they compete.
    nice: int = Field(default=10, ge=0, le=19)
    # Events the indexer takes into one transaction at most: it takes what has arrived, so one at a time when
    # idle (fresh) and up to this many under a backlog (fewer transactions and `embedding_generated` entries per
    # create); the bound on how long one batch holds its events back.
    max_batch: int = Field(default=256, ge=1, le=10_000)
    # Texts per embedder call inside a batch.
    embed_batch: int = Field(default=64, ge=1, le=4096)
    # Outbox sender: entries per pass, how often it looks when idle, and its backoff cap when the writer is away.
    outbox_batch: int = Field(default=64, ge=1, le=10_000)
    outbox_poll_seconds: float = Field(default=0.2, gt=0, le=60)
    outbox_retry_max_seconds: float = Field(default=10.0, gt=0, le=600)
    # How often it looks for a space left `filling` to fill (one at a time, an advisory lock per space).
    rebuild_poll_seconds: float = Field(default=1.0, gt=0, le=600)
    # Current objects read, embedded and written per rebuild step.
    rebuild_batch: int = Field(default=64, ge=1, le=10_000)


class AuthSettings(_Group):
    """Who may call (docs/security.md): credentials, the grants snapshot's refresh, and the denial audit."""

    # "enforce": every request needs a credential and a grant; "off": no checks at all (a trusted network,
    # the benchmarks' baseline). Never "off" where an untrusted client can reach NATS.
    mode: Literal["enforce", "off"] = "enforce"
    # The administrative and the service credential (made by `pamledger up`/`run` when absent); default
    # <state_dir>/admin.token and <state_dir>/service.token, mode 0600.
    admin_token_file: Path | None = None
    service_token_file: Path | None = None
    # How often a process looks for changed grants: a revocation takes effect within this (plus one read).
    refresh_seconds: float = Field(default=0.5, gt=0, le=1.0)
    # access_denied entries: per caller and rule, this many at once and one more every denial_every_seconds.
    denial_burst: int = Field(default=5, ge=1, le=10_000)
    denial_every_seconds: float = Field(default=1.0, gt=0, le=3600)
    # TLS for the NATS server `pamledger up` / `run --local` start (both set: it requires TLS); clients
    # verify it against nats_tls_ca (default: the system's CAs). docs/security.md, "Transport".
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    nats_tls_ca: Path | None = None


class RetentionSettings(_Group):
    """The retention evaluator (role `retention`, off by default): it proposes expirations from valid_until and
    the scopes' retention policies as transition commands (docs/architecture.md, "Retention")."""

    # On: `pamledger run` (roles `all`) runs the role too. Off: only `--roles retention` or the CLI evaluates.
    enabled: bool = False
    every_seconds: float = Field(default=3600.0, gt=0, le=31_536_000)
    # Proposals sent per round at most; the rest wait for the next round.
    max_per_round: int = Field(default=10_000, ge=1, le=1_000_000)


class McpSettings(_Group):
    """`pamledger mcp`, the MCP binding (docs/protocol.md "The MCP binding"): transport, tools, HTTP callers."""

    transport: Literal["stdio", "http"] = "stdio"
    host: str = "127.0.0.1"  # HTTP: loopback unless told otherwise
    port: int = Field(default=8765, ge=0, le=65535)  # HTTP; 0 picks a free port (printed at start)
    tools: Literal["all", "core"] = "all"  # core: read, query, search, create, update, inspect_history
    # stdio: stdin/stdout as asyncio pipes (false: the SDK's own streams, a worker thread per line each way).
    stdio_pipes: bool = True
    # HTTP: answer each POST with one JSON body rather than an SSE stream (about twice the calls per second of
    # CPU here; the binding sends nothing during a call). Doorbells still ride the GET stream.
    http_json_response: bool = True
    # Host headers accepted besides loopback and `host` (DNS-rebinding protection; `name:*` allows any port).
    allowed_hosts: list[str] = Field(default_factory=list)
    # HTTP: a bearer token is proved again (query.whoami) once its last proof is older than this.
    verify_seconds: float = Field(default=1.0, gt=0, le=60)
    # HTTP: a credential's client unused this long is closed; at most max_callers credentials at once.
    idle_seconds: float = Field(default=600.0, gt=0)
    max_callers: int = Field(default=1000, ge=1, le=100_000)
    # Tool calls of one credential at the service at once (more wait): one flooding agent slows only itself.
    max_in_flight: int = Field(default=32, ge=1, le=10_000)


class MetricsSettings(_Group):
    """Each role process's /metrics, /healthz and /readyz (infra.probes)."""

    # The base port: a process serving one role adds the role's offset (writer 0, query 1, projector 2,
    # indexer 3, gateway 4, retention 5: pamledger.runtime.probe_port); a process of several roles uses it as
    # is. 0 turns the side door off. A port in use is logged and the role serves on without it.
    port: int = Field(default=9464, ge=0, le=65535)
    host: str = "127.0.0.1"


class TracingSettings(_Group):
    """OpenTelemetry traces (infra.tracing): off unless an endpoint is set here or in OTEL_EXPORTER_OTLP_ENDPOINT."""

    # The OTLP/HTTP base URL (spans are posted to {endpoint}/v1/traces), e.g. http://127.0.0.1:4318.
    endpoint: str | None = None


class NatsSettings(_Group):
    """NATS as one server (the default) or a JetStream cluster (docs/scaling.md, "NATS: a JetStream cluster")."""

    # How many nats-server nodes `pamledger up|run --local` starts on loopback: 1, or a cluster of 3 (or 5),
    # each with its own store and routes to the others, each supervised and restarted in place by `run`.
    nodes: int = Field(default=1, ge=1, le=7)
    # Copies JetStream keeps of the ledger stream (num_replicas). Unset: one per NATS server the service is
    # given (the nodes it started, or the URLs of PAMLEDGER_NATS_URL), at most 3. An existing stream is
    # changed to it at the relay's next start.
    stream_replicas: int | None = Field(default=None, ge=1, le=5)


class Settings(BaseSettings):
    """Everything a pamledger process needs; unset URLs mean 'the servers `pamledger up` started'."""

    model_config = SettingsConfigDict(env_prefix="PAMLEDGER_", env_nested_delimiter="__")

    @field_validator("log_format", "log_level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    nats_url: str | None = None  # one URL, or every node's of a cluster, comma-separated
    database_url: str | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    subject_prefix: str = DEFAULT_PREFIX
    stream_name: str = "PAMLEDGER"
    partition: int = Field(default=0, ge=0, lt=MAX_PARTITIONS)  # infra.locks: each role's lock key per partition
    # How many partitions the ledger is split into (infra.partitions): recorded with the ledger when it is made
    # and refused at start when changed. Each writer process leads whichever partitions are free.
    partitions: int = Field(default=1, ge=1, le=MAX_PARTITIONS)
    log_format: Literal["auto", "json", "console"] = "auto"  # auto: console on a terminal, else JSON lines
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    request_timeout_seconds: float = 10.0
    processes: Literal["split", "single"] = "split"
    # The credential the SDK and the CLI send (PAMLEDGER_TOKEN); unset: the state dir's admin.token, if any.
    token: str | None = None
    nats: NatsSettings = NatsSettings()
    writer: WriterSettings = WriterSettings()
    query: QuerySettings = QuerySettings()
    database: DatabaseSettings = DatabaseSettings()
    gateway: GatewaySettings = GatewaySettings()
    follower: FollowerSettings = FollowerSettings()
    indexer: IndexerSettings = IndexerSettings()
    auth: AuthSettings = AuthSettings()
    retention: RetentionSettings = RetentionSettings()
    mcp: McpSettings = McpSettings()
    metrics: MetricsSettings = MetricsSettings()
    tracing: TracingSettings = TracingSettings()

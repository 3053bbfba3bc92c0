"""Query → SQL. Every statement is bound to one scope; identifiers go through psycopg.sql only.

Ordering profiles and their total order (ledger_sequence is unique per row, object_id and version_id
close every profile so the order is total by construction):
  newest  ledger_sequence DESC, object_id DESC, version_id DESC         (default)
  oldest  ledger_sequence ASC, object_id ASC, version_id ASC
  score   ts_rank_cd DESC, ledger_sequence DESC, object_id DESC, version_id DESC   (needs text)
  <time field>_desc / _asc   the field (missing values last), then ledger_sequence, object_id, version_id
  <quality signal>_desc / _asc   the signal from quality_signals (missing values last), then the same tail;
                                 assessed_confidence_desc is served by an index (infra/sql/011_quality.sql)
Pagination is keyset: the cursor holds the last row's sort key and the query's digest.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from infra.ledger import hidden_by_latest, latest_version
from infra.projections import SEARCH_EXPRESSION
from schemas.evaluation import run_evidence
from schemas.queries import QUALITY_SIGNALS, Filters, QueryRequest

_FILTERS = (
    ("object_types", "object_type"), ("schema_ids", "schema_id"), ("lifecycle_states", "lifecycle_state"),
    ("availability_states", "availability_state"), ("retention_states", "retention_state"),
    ("validation_states", "validation_state"), ("actor_ids", "actor_id"), ("provenance_ids", "provenance_id"),
)
_NOT_NULL_TIMES = ("committed_at", "recorded_at")
# Versions as they stood at a sequence, without content a later redaction hides (infra.ledger.HIDING_STATES).
# Relationship Versions (no object_type) are not Memory Objects: query.related finds them.
_TEMPORAL_SELECT = """
  SELECT v.scope_id, v.object_id, v.version_id, v.ledger_sequence, d.shown AS content_digest, v.meta,
         m->>'object_type' AS object_type, m->>'schema_id' AS schema_id,
         m->>'lifecycle_state' AS lifecycle_state, m->>'availability_state' AS availability_state,
         m->>'retention_state' AS retention_state, m->>'validation_state' AS validation_state,
         m->'actor'->>'actor_id' AS actor_id, m->'provenance'->>'provenance_id' AS provenance_id,
         (m->>'observed_at')::timestamptz AS observed_at, (m->>'asserted_at')::timestamptz AS asserted_at,
         (m->>'valid_from')::timestamptz AS valid_from, (m->>'valid_until')::timestamptz AS valid_until,
         (m->>'committed_at')::timestamptz AS committed_at, (m->>'recorded_at')::timestamptz AS recorded_at,
         {search} AS search
  FROM {versions} v
  CROSS JOIN LATERAL (SELECT convert_from(v.meta, 'UTF8')::jsonb AS m) j
  """ + latest_version("v") + """
  CROSS JOIN LATERAL (SELECT CASE WHEN """ + hidden_by_latest("v") + """ THEN NULL ELSE v.content_digest END AS shown) d
  LEFT JOIN content_store c ON c.content_digest = d.shown
  WHERE j.m ? 'object_type'"""
# Each object's newest version at or before a sequence (parameters: scope_id, the sequence; `changed`: a
# further restriction, _CHANGED_SINCE's, or none).
_AT_SEQUENCE = ("(SELECT DISTINCT ON (object_id) * FROM memory_versions"
                " WHERE scope_id = %s AND ledger_sequence <= %s{changed} ORDER BY object_id, sequence DESC)")
AT_SEQUENCE = _AT_SEQUENCE.format(changed="")
# The same rows, read mostly from the projection (used once the projector has reached the sequence): an object
# nothing in the ledger touched after the sequence stands there as its current_objects row says (its newest
# version is at or before the sequence, no later version hides it, and content is only erased by a later entry
# of the object: command_handler.store), so only the objects touched after it (ledger entries, or projection
# rows newer than it) are rebuilt from the versions. Costs what the live query does plus the changes since the
# sequence, where the versions alone cost a pass over every version of the scope (python -m bench evaluation).
_UNCHANGED_SOURCE = """
  SELECT o.scope_id, o.object_id, o.version_id, o.ledger_sequence, o.content_digest, o.meta, o.object_type,
         o.schema_id, o.lifecycle_state, o.availability_state, o.retention_state, o.validation_state, o.actor_id,
         o.provenance_id, o.observed_at, o.asserted_at, o.valid_from, o.valid_until, o.committed_at, o.recorded_at,
         {search} AS search
  FROM current_objects o
  WHERE o.scope_id = %s AND o.ledger_sequence <= %s
    AND NOT EXISTS (SELECT 1 FROM ledger t WHERE t.scope_id = o.scope_id AND t.object_id = o.object_id
                    AND t.ledger_sequence > %s)"""
_CHANGED_SINCE = """ AND object_id IN (
          SELECT t.object_id FROM ledger t WHERE t.scope_id = %s AND t.partition = %s AND t.ledger_sequence > %s
                                                 AND t.object_id IS NOT NULL
          UNION SELECT n.object_id FROM current_objects n WHERE n.scope_id = %s AND n.ledger_sequence > %s)"""


_COLUMNS = ("object_id, version_id, ledger_sequence, content_digest, meta, object_type, schema_id, lifecycle_state,"
            " availability_state, retention_state, validation_state, actor_id, provenance_id, observed_at, asserted_at,"
            " valid_from, valid_until, committed_at, recorded_at, search")
# A base scope's rows at a snapshot, as an evaluation scope forked from it reads them: filed under the
# evaluation scope, members only, those the evaluation scope has not written (query.plan.fork_sources).
_FORKED = ("(SELECT %s::text AS scope_id, " + ", ".join("t." + c.strip() for c in _COLUMNS.split(",")) +
           " FROM {source} t WHERE (%s::text[] IS NULL OR t.object_id = ANY(%s::text[]))"
           " AND NOT EXISTS (SELECT 1 FROM current_objects e WHERE e.scope_id = %s AND e.object_id = t.object_id))")


def sort_key(request: QueryRequest) -> tuple[list[tuple[str, str, str]], str]:
    """[(order expression, selected expression, cursor parameter)] of the sort key, and the direction.

    Time fields sort missing values last through an infinity sentinel that is never selected (Python
    datetimes cannot hold infinity), so the cursor carries the raw value and the comparison re-applies it.
    """
    tail = [("p.ledger_sequence", "p.ledger_sequence", "%s::bigint"), ("p.object_id", "p.object_id", "%s::text"),
            ("p.version_id", "p.version_id", "%s::text")]
    order = request.order
    if order in ("newest", "oldest"):
        return tail, "DESC" if order == "newest" else "ASC"
    if order == "score":
        rank = "ts_rank_cd(p.search, q.query)"
        return [(rank, rank, "%s::real"), *tail], "DESC"
    field, direction = order.rsplit("_", 1)
    if field in QUALITY_SIGNALS:
        return [*_quality_key(field, direction), *tail], direction.upper()
    if field in _NOT_NULL_TIMES:  # plain column, so (scope_id, committed_at DESC, …) indexes serve the order
        return [(f"p.{field}", f"p.{field}", "%s::timestamptz"), *tail], direction.upper()
    sentinel = "'-infinity'::timestamptz" if direction == "desc" else "'infinity'::timestamptz"
    return [(f"coalesce(p.{field}, {sentinel})", f"p.{field}", f"coalesce(%s::timestamptz, {sentinel})"),
            *tail], direction.upper()


def quality_expression(signal: str) -> str:
    """The SQL of one quality signal of the row `p` (NULL when absent). The signal is a name of the closed
    QUALITY_SIGNALS set, written out literally so the expression matches the index's byte for byte."""
    if signal not in QUALITY_SIGNALS:
        raise ValueError(f"not a quality signal: {signal!r}")
    return f"pamledger_quality_signal(p.meta, '{signal}')"


def _quality_key(signal: str, direction: str) -> list[tuple[str, str, str]]:
    """A quality signal's sort column: missing values last through an infinite sentinel, as for time fields."""
    sentinel = "'-Infinity'::double precision" if direction == "desc" else "'Infinity'::double precision"
    value = quality_expression(signal)
    return [(f"coalesce({value}, {sentinel})", value, f"coalesce(%s::double precision, {sentinel})")]


def temporal_sources(scope: str, text: bool, as_of: int, projected: bool, partition: int = 0
                     ) -> list[tuple[str, list[Any]]]:
    """The scope's objects as they stood at ledger sequence `as_of`, with the columns of current_objects, as
    sources whose rows together are that state: the versions alone, or (`projected`: the projector has reached
    `as_of`; its checkpoint, read in the caller's snapshot or before it, never goes back) the unchanged objects
    from the projection and the changed ones from the versions. `text`: with the full-text vector."""
    search = SEARCH_EXPRESSION if text else "NULL::tsvector"
    if not projected:
        return [("(" + _TEMPORAL_SELECT.format(search=search, versions=AT_SEQUENCE) + ")", [scope, as_of])]
    unchanged = _UNCHANGED_SOURCE.format(search="o.search" if text else "NULL::tsvector")
    changed = _TEMPORAL_SELECT.format(search=search, versions=_AT_SEQUENCE.format(changed=_CHANGED_SINCE))
    return [("(" + unchanged + ")", [scope, as_of, as_of]),
            ("(" + changed + ")", [scope, as_of, scope, partition, as_of, scope, as_of])]


def temporal_source(with_search: bool, versions: str = AT_SEQUENCE) -> sql.SQL:
    """The projection row shape `p` over chosen versions (`versions`: which memory_versions rows, by default
    every object's newest at a sequence, AT_SEQUENCE: two parameters, scope_id and the sequence), for
    filter_clauses and the orders; `with_search`: its full-text vector too (computed per row)."""
    search = SEARCH_EXPRESSION if with_search else "NULL::tsvector"
    return sql.SQL("(" + _TEMPORAL_SELECT.format(search=search, versions=versions) + ")")


def fork_sources(request: QueryRequest, fork: tuple[str, int, list[str] | None], projected: bool,
                 partition: int = 0) -> list[tuple[str, list[Any]]]:
    """An evaluation scope as it reads (query.evaluation): its own current objects, then its run's snapshot's
    (base scope at the watermark, members only) that it has not written, filed under the evaluation scope."""
    scope = request.scope_id
    base, watermark, members = fork
    own = "(SELECT scope_id, " + _COLUMNS + " FROM current_objects WHERE scope_id = %s)"
    found: list[tuple[str, list[Any]]] = [(own, [scope])]
    for source, params in temporal_sources(base, bool(request.text), watermark, projected, partition):
        found.append((_FORKED.format(source=source), [scope, *params, members, members, scope]))
    return found


def build(request: QueryRequest, after: list[Any] | None, as_of: int | None,
          members: list[str] | None = None, projected: bool = False, partition: int = 0,
          fork: tuple[str, int, list[str] | None] | None = None) -> tuple[sql.Composed, list[Any]]:
    """The SELECT for one page: rows of (meta, content, sort key values…); `members`: only these objects (a
    snapshot's named members); `projected`: the projector has reached `as_of` (or the fork's watermark:
    temporal_sources); `fork`: the request's scope is an evaluation scope forked from (base scope, watermark,
    members): the snapshot's objects it has not written are read too (live reads only).

    Over two sources or more each one's page is cut first (ordered and limited by its own plan: the
    projection's by the indexes the live query uses), then the pages are merged and only the page's content
    is read."""
    keys, direction = sort_key(request)
    key_sql = sql.SQL(", ").join(sql.SQL(selected) for _, selected, _ in keys)
    order_by = sql.SQL(", ").join(sql.SQL(f"{expr} {direction}") for expr, _, _ in keys)
    text_join = sql.SQL(" CROSS JOIN websearch_to_tsquery('english', %s) AS q(query)" if request.text else "")
    text_params = [request.text] if request.text else []
    where, where_params = _where(request, after, keys, direction)
    if members is not None:
        where = where + sql.SQL(" AND p.object_id = ANY(%s)")
        where_params = [*where_params, members]
    if as_of is not None:
        sources = temporal_sources(request.scope_id, bool(request.text), as_of, projected, partition)
    elif fork is not None:
        sources = fork_sources(request, fork, projected, partition)
    else:
        sources = [("current_objects", [])]
    select = sql.SQL("SELECT p.meta, c.content, {keys} FROM {source} p"
                     " LEFT JOIN content_store c ON c.content_digest = p.content_digest{text} WHERE {where}"
                     " ORDER BY {order} LIMIT %s")
    if len(sources) == 1:
        source, params = sources[0]
        statement = select.format(keys=key_sql, source=sql.SQL(source), text=text_join, where=where, order=order_by)
        return statement, [*params, *text_params, *where_params, request.limit + 1]
    branch = sql.SQL("(SELECT p.* FROM {source} p{text} WHERE {where} ORDER BY {order} LIMIT %s)")
    branches: list[sql.Composable] = []
    params = []
    for source, source_params in sources:
        branches.append(branch.format(source=sql.SQL(source), text=text_join, where=where, order=order_by))
        params += [*source_params, *text_params, *where_params, request.limit + 1]
    merged = sql.SQL("(") + sql.SQL(" UNION ALL ").join(branches) + sql.SQL(")")
    statement = select.format(keys=key_sql, source=merged, text=text_join, where=sql.SQL("true"), order=order_by)
    return statement, [*params, *text_params, request.limit + 1]


def _where(request: QueryRequest, after: list[Any] | None, keys: list[tuple[str, str, str]],
           direction: str) -> tuple[sql.Composed, list[Any]]:
    clauses: list[sql.Composable] = [sql.SQL("p.scope_id = %s")]
    params: list[Any] = [request.scope_id]
    filters, filter_params = filter_clauses(request)
    clauses += filters
    params += filter_params
    if request.text:
        clauses.append(sql.SQL("p.search @@ q.query"))
    if after is not None:
        left = sql.SQL(", ").join(sql.SQL(expr) for expr, _, _ in keys)
        right = sql.SQL(", ").join(sql.SQL(param) for _, _, param in keys)
        op = "<" if direction == "DESC" else ">"
        clauses.append(sql.SQL("({}) {} ({})").format(left, sql.SQL(op), right))
        params += after
    return sql.SQL(" AND ").join(clauses), params


def filter_clauses(request: Filters) -> tuple[list[sql.Composable], list[Any]]:
    """The structured filters as clauses over the projection row `p` (current_objects or its temporal
    twin), ANDed by the caller: Query and Search apply exactly the same ones."""
    clauses: list[sql.Composable] = []
    params: list[Any] = []
    for attr, column in _FILTERS:
        values = getattr(request, attr)
        if values is not None:
            clauses.append(sql.SQL("p.{} = ANY(%s)").format(sql.Identifier(column)))
            params.append(list(values))
    for field, window in sorted((request.time or {}).items()):
        if window.gte is not None:
            clauses.append(sql.SQL("p.{} >= %s").format(sql.Identifier(field)))
            params.append(window.gte)
        if window.lt is not None:
            clauses.append(sql.SQL("p.{} < %s").format(sql.Identifier(field)))
            params.append(window.lt)
    for signal, bounds in sorted((request.quality or {}).items()):
        for bound, op in ((bounds.gte, ">="), (bounds.lte, "<=")):
            if bound is not None:
                clauses.append(sql.SQL(f"{quality_expression(signal)} {op} %s::double precision"))
                params.append(bound)
    if request.evaluation_run_id is not None:  # schemas.evaluation: where a version names its run
        clauses.append(sql.SQL("(convert_from(p.meta, 'UTF8')::jsonb #> '{provenance,evidence_refs}')"
                               " @> jsonb_build_array(%s::text)"))
        params.append(run_evidence(request.evaluation_run_id))
    if request.ledger_sequence is not None:
        if request.ledger_sequence.gte is not None:
            clauses.append(sql.SQL("p.ledger_sequence >= %s"))
            params.append(request.ledger_sequence.gte)
        if request.ledger_sequence.lte is not None:
            clauses.append(sql.SQL("p.ledger_sequence <= %s"))
            params.append(request.ledger_sequence.lte)
    return clauses, params

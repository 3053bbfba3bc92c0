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
from schemas.queries import QUALITY_SIGNALS, Filters, QueryRequest

_FILTERS = (
    ("object_types", "object_type"), ("schema_ids", "schema_id"), ("lifecycle_states", "lifecycle_state"),
    ("availability_states", "availability_state"), ("retention_states", "retention_state"),
    ("validation_states", "validation_state"), ("actor_ids", "actor_id"), ("provenance_ids", "provenance_id"),
)
_NOT_NULL_TIMES = ("committed_at", "recorded_at")
# Versions as they stood at a sequence, without content a later redaction hides (infra.ledger.HIDING_STATES).
# Relationship Versions (no object_type) are not Memory Objects: query.related finds them.
_TEMPORAL_SOURCE = """(
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
  WHERE j.m ? 'object_type'
)"""


# Each object's newest version at or before a sequence (parameters: scope_id, the sequence).
AT_SEQUENCE = ("(SELECT DISTINCT ON (object_id) * FROM memory_versions"
               " WHERE scope_id = %s AND ledger_sequence <= %s ORDER BY object_id, sequence DESC)")


# Each changed object's newest version at or before a sequence (parameters: scope_id, the sequence); `changed`
# is _CHANGED's.
_CHANGED_AT_SEQUENCE = ("(SELECT w.* FROM changed s CROSS JOIN LATERAL (SELECT * FROM memory_versions x"
                        " WHERE x.scope_id = %s AND x.object_id = s.object_id AND x.ledger_sequence <= %s"
                        " ORDER BY x.sequence DESC LIMIT 1) w)")
# The objects with ledger entries after a sequence (parameters: scope_id, the sequence). Every other object is
# still at the version current_objects holds once the projection has passed the sequence, and nothing erased
# or hid its content since (only an entry of its own does): build_pinned reads those from the projection.
_CHANGED = ("WITH changed AS MATERIALIZED (SELECT DISTINCT object_id FROM ledger"
            " WHERE scope_id = %s AND ledger_sequence > %s AND object_id IS NOT NULL) ")
_UNCHANGED = " AND p.ledger_sequence <= %s AND NOT EXISTS (SELECT 1 FROM changed h WHERE h.object_id = p.object_id)"


def temporal_source(with_search: bool, versions: str = AT_SEQUENCE) -> sql.SQL:
    """The projection row shape `p` as the scope stood at a ledger sequence (two parameters: scope_id, the
    sequence), for filter_clauses and the orders; `with_search`: its full-text vector too (computed per row).
    `versions`: which memory_versions rows to shape (default: every object's at the sequence, AT_SEQUENCE)."""
    search = SEARCH_EXPRESSION if with_search else "NULL::tsvector"
    return sql.SQL(_TEMPORAL_SOURCE.format(search=search, versions=versions))


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


def build(request: QueryRequest, after: list[Any] | None, as_of: int | None,
          members: list[str] | None = None, projected: bool = False) -> tuple[sql.Composed, list[Any]]:
    """The SELECT for one page: rows of (meta, content, sort key values…); `members`: only these objects (a
    snapshot's named members); `projected`: the projection has passed `as_of` (build_pinned)."""
    if as_of is not None and projected:
        return build_pinned(request, after, as_of, members)
    if as_of is None:
        return _page(request, after, sql.SQL("current_objects"), members)
    statement, params = _page(request, after, temporal_source(bool(request.text)), members)
    return statement, [request.scope_id, as_of, *params]


def build_pinned(request: QueryRequest, after: list[Any] | None, as_of: int,
                 members: list[str] | None) -> tuple[sql.Composed, list[Any]]:
    """The page at `as_of` once the projection has passed it: the objects unchanged since from current_objects
    (its indexes serve the order and the limit), the changed ones shaped from their versions, each branch
    ordered and cut to the page, then merged by the same total order (missing values last, as sort_key)."""
    projected, projected_params = _page(request, after, sql.SQL("current_objects"), members,
                                        (sql.SQL(_UNCHANGED), [as_of]))
    changed, changed_params = _page(request, after, temporal_source(bool(request.text), _CHANGED_AT_SEQUENCE),
                                    members)
    keys, direction = sort_key(request)
    merged = sql.SQL(", ").join(sql.SQL(f"{i} {direction} NULLS LAST") for i in range(3, 3 + len(keys)))
    statement = sql.Composed([sql.SQL(_CHANGED), sql.SQL("SELECT * FROM (("), projected, sql.SQL(") UNION ALL ("),
                              changed, sql.SQL(")) u ORDER BY {} LIMIT %s").format(merged)])
    return statement, [request.scope_id, as_of, *projected_params, request.scope_id, as_of, *changed_params,
                       request.limit + 1]


def _page(request: QueryRequest, after: list[Any] | None, source: sql.Composable, members: list[str] | None,
          extra: tuple[sql.Composable, list[Any]] | None = None) -> tuple[sql.Composed, list[Any]]:
    """One page's SELECT over `source` (its own parameters are the caller's), `extra` ANDed to the WHERE."""
    params: list[Any] = []
    keys, direction = sort_key(request)
    key_sql = sql.SQL(", ").join(sql.SQL(selected) for _, selected, _ in keys)
    parts: list[sql.Composable] = [sql.SQL("SELECT p.meta, c.content, {keys} FROM {source} p").format(keys=key_sql, source=source),
             sql.SQL(" LEFT JOIN content_store c ON c.content_digest = p.content_digest")]
    if request.text:
        parts.append(sql.SQL(" CROSS JOIN websearch_to_tsquery('english', %s) AS q(query)"))
        params.append(request.text)
    where, where_params = _where(request, after, keys, direction)
    parts.append(sql.SQL(" WHERE ") + where)
    params += where_params
    if members is not None:
        parts.append(sql.SQL(" AND p.object_id = ANY(%s)"))
        params.append(members)
    if extra is not None:
        parts.append(extra[0])
        params += extra[1]
    order_by = sql.SQL(", ").join(sql.SQL(f"{expr} {direction}") for expr, _, _ in keys)
    parts.append(sql.SQL(" ORDER BY {order} LIMIT %s").format(order=order_by))
    params.append(request.limit + 1)
    return sql.Composed(parts), params


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
    if request.ledger_sequence is not None:
        if request.ledger_sequence.gte is not None:
            clauses.append(sql.SQL("p.ledger_sequence >= %s"))
            params.append(request.ledger_sequence.gte)
        if request.ledger_sequence.lte is not None:
            clauses.append(sql.SQL("p.ledger_sequence <= %s"))
            params.append(request.ledger_sequence.lte)
    return clauses, params

-- [M5] Quality signals in query filters and orders (PAMSPEC 8.7). No new column: the signals stay in the
-- projected envelope (`meta`), read through one function, so the projector, `replay` and the byte-identical
-- rebuild are untouched. The index serves the `assessed_confidence_desc` order (its expression is exactly
-- the one query.plan sorts by); filters on any signal evaluate the function on the rows the other filters
-- leave.
--
-- IMMUTABLE is true in practice: `meta` is canonical UTF-8 JSON and a database's encoding never changes
-- (convert_from alone is only STABLE because it consults that encoding). A value that is not a JSON
-- number reads as NULL (the writer accepts only numbers in [0, 1], so this is belt and braces).
CREATE FUNCTION pamledger_quality_signal(meta bytea, signal text) RETURNS double precision
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
        SELECT CASE WHEN jsonb_typeof(q -> signal) = 'number' THEN (q ->> signal)::double precision END
        FROM (SELECT convert_from(meta, 'UTF8')::jsonb -> 'quality_signals' AS q) s
    $$;

CREATE INDEX current_objects_confidence_idx ON current_objects (
    scope_id,
    coalesce(pamledger_quality_signal(meta, 'assessed_confidence'), '-Infinity'::double precision) DESC,
    ledger_sequence DESC, object_id DESC, version_id DESC);

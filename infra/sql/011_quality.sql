-- [M5] Quality signals in query filters and orders (PAMSPEC 8.7). No new column: the signals stay in the
-- projected envelope (`meta`), read through one function, so the projector, `replay` and the byte-identical
-- rebuild are untouched. The index serves the `assessed_confidence_desc` order (its expression is exactly
-- the one query.plan sorts by); filters on any signal evaluate the function on the rows the other filters
-- leave.
--
-- The function runs in the projector's writes (through the index), so it must never raise on a `meta` the
-- projector can store, or one odd envelope would stop the projection:
-- * a `\u0000` escape (valid JSON, which jsonb refuses) is read as `\u0001`: only the signals are read, and
--   the replacement keeps the JSON valid whether the backslash starts an escape or ends an escaped `\\`;
-- * a signal that is not a JSON number in [0, 1] reads as NULL (the writer accepts only those: belt and
--   braces; no number outside the double range, too large or too small, is ever cast);
-- * an envelope without quality_signals is not parsed at all (most of them).
-- IMMUTABLE holds in practice: `meta` is canonical UTF-8 JSON and a database's encoding never changes
-- (convert_from alone is only STABLE because it consults that encoding).
CREATE FUNCTION pamledger_quality_signal(meta bytea, signal text) RETURNS double precision
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
        SELECT CASE WHEN jsonb_typeof(v) = 'number'  -- nested CASEs: AND does not fix the order of evaluation
                    THEN CASE WHEN v::text::numeric BETWEEN 0 AND 1 THEN v::text::double precision END END
        FROM (SELECT CASE WHEN position('"quality_signals":'::bytea IN meta) > 0
                          THEN replace(convert_from(meta, 'UTF8'), '\u0000', '\u0001')::jsonb
                               -> 'quality_signals' -> signal END AS v) s
    $$;

CREATE INDEX current_objects_confidence_idx ON current_objects (
    scope_id,
    coalesce(pamledger_quality_signal(meta, 'assessed_confidence'), '-Infinity'::double precision) DESC,
    ledger_sequence DESC, object_id DESC, version_id DESC);

-- [M4] Embedding Spaces and their vectors: derived state, rebuilt from the ledger and the content store.
--
-- A space is registered by an `index_rebuilt` ledger entry (payload.action = 'space_registered', in the
-- system scope below); the indexer follower projects it into `embedding_spaces` and creates the space's own
-- vector table `embedding_vectors_<space_key>` (vector(<dimensions>), one HNSW index), so vectors of two
-- spaces can never share a column, an index or a comparison. Everything here can be dropped and rebuilt.

CREATE EXTENSION IF NOT EXISTS vector;

-- The scope that holds the service's own ledger entries (space registrations, the default space switch).
-- Not a memory scope: nothing can create objects in it that a client did not ask for (and [M6] guards it).
INSERT INTO scopes (scope_id, scope_kind) VALUES ('system:pamledger', 'system') ON CONFLICT DO NOTHING;

CREATE TABLE embedding_spaces (
    embedding_space_id  text        PRIMARY KEY,
    space_key           integer     NOT NULL UNIQUE,  -- names the vector table: embedding_vectors_<space_key>
    descriptor          bytea       NOT NULL,         -- canonical JSON of the descriptor
    space_digest        text        NOT NULL,         -- sha256 of `descriptor`
    dimensions          integer     NOT NULL CHECK (dimensions BETWEEN 1 AND 2000),
    registered_sequence bigint      NOT NULL,         -- the ledger entry that registered it
    state               text        NOT NULL DEFAULT 'filling' CHECK (state IN ('filling', 'ready')),
    filled_sequence     bigint,                       -- the follower checkpoint its last fill started from
    is_default          boolean     NOT NULL DEFAULT false,
    default_sequence    bigint                        -- the ledger entry that made it the default
);
CREATE UNIQUE INDEX embedding_spaces_one_default ON embedding_spaces (is_default) WHERE is_default;

-- Ledger entries the indexer still owes (embedding_generated / index_rebuilt): written in the same
-- transaction as the vectors they describe, sent to the writer afterwards with an idempotency key, and
-- deleted once the writer acknowledged them (a transactional outbox: a crash loses none, a resend is a replay).
CREATE TABLE index_outbox (
    outbox_id       bigserial PRIMARY KEY,
    scope_id        text      NOT NULL,
    event_type      text      NOT NULL CHECK (event_type IN ('embedding_generated', 'index_rebuilt')),
    idempotency_key text      NOT NULL UNIQUE,
    payload         bytea     NOT NULL
);

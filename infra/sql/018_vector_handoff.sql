-- [C1] Vectors an import hands to the indexer (`pamledger import` of a bundle exported with --vectors). The
-- writer stores them in the same transaction as the imported entries, only for spaces this service registered
-- with the same descriptor digest (schemas.embedding.same_space); the indexer stores such a vector instead of
-- embedding the version's content, and deletes every row of an object once it has applied that version or a
-- later one, or an erasure of the object (embedding/handoff.py). One row per object and space: an export
-- carries at most one vector of an object in a space.
CREATE TABLE vector_handoff (
    scope_id           text    NOT NULL,
    object_id          text    NOT NULL,
    embedding_space_id text    NOT NULL,
    space_digest       text    NOT NULL,
    version_id         text    NOT NULL,
    version_sequence   integer NOT NULL,
    content_digest     text    NOT NULL,
    embedding          vector  NOT NULL,
    PRIMARY KEY (scope_id, object_id, embedding_space_id)
);

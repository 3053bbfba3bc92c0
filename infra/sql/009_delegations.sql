-- [M6] Delegations (PAMSPEC-Delegation). The writer keeps each one's state here, written in the same
-- transaction as its ledger entries (delegation_granted / _exercised / _revoked), so counting uses is exact:
-- one writer decides every check in order. The ledger stays the source of truth: each row can be rebuilt
-- from those entries.

CREATE TABLE delegations (
    delegation_id    text    PRIMARY KEY,
    scope_id         text    NOT NULL,
    grant_object     bytea   NOT NULL,  -- the Delegation Object (delegation.schema.json), canonical JSON
    uses             integer NOT NULL DEFAULT 0 CHECK (uses >= 0),
    revoked          boolean NOT NULL DEFAULT false
);

-- [H2] The credential a subscription is delivered under: the token that opened it, or the token that last
-- resumed it. Revoking that token (or its expiry) closes the subscription with `access_revoked`, naming the
-- last delivered sequence (subscriptions.gateway). NULL: auth off, or opened before this migration (then only
-- the actor's grants are checked, as before).
ALTER TABLE subscriptions ADD COLUMN credential_id text;

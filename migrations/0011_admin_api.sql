-- The admin API (SPEC §14, "Managing chime as code"): archived biz types and admin tokens.
-- Expand only: a nullable column and a new table; the previous release ignores both.

-- When a biz type was archived (NULL: in use). An archived biz type keeps its row, so its
-- name stays reserved and its tasks stay readable until retention drops them. Nullable
-- without a default: a brief ACCESS EXCLUSIVE lock on biz_types (a few rows), no rewrite.
ALTER TABLE biz_types ADD COLUMN archived_at timestamptz;

-- Admin tokens authorise /api/v1/admin/ only. Like API tokens they are random 32 bytes
-- shown once; only a SHA-256 is kept. A new table: takes no lock anything else waits on.
CREATE TABLE admin_tokens (
    id          uuid PRIMARY KEY,
    -- who or what holds it (a CI job, a person), as the audit log names it
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    token_hash  bytea NOT NULL UNIQUE,
    -- first characters of the token, to recognise it in lists without revealing it
    prefix      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

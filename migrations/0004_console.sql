-- The console's dashboard reads the last hour of attempts per biz type: the biz type and
-- how late the attempt started are kept on the attempt, and a BRIN index (tiny, and
-- nearly free to maintain on rows that arrive in time order) finds the last hour.
ALTER TABLE attempts ADD COLUMN biz_type_id integer, ADD COLUMN lateness_ms integer;
CREATE INDEX attempts_started_brin ON attempts USING brin (started_at);

-- Console sign-ins. The cookie holds a random token; only its SHA-256 is stored.
CREATE TABLE sessions (
    token_hash    bytea PRIMARY KEY,
    user_id       integer NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- every form of the session carries this token (CSRF)
    csrf_token    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX sessions_expires_idx ON sessions (expires_at);

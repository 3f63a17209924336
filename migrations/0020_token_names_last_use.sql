-- Which API token is safe to revoke, and who still signs in (issue 16). Expand only:
-- nullable columns without a default, so each ALTER takes a brief ACCESS EXCLUSIVE lock
-- on a small table (tokens, users) and rewrites nothing; the previous release neither
-- reads nor writes them.

-- What a token is for ("ci", "billing worker"), given when it is made; NULL: unnamed (every
-- token made before). At most 64 characters, as admin_tokens.name; chime also refuses
-- control characters (not checked here: what [[:cntrl:]] matches depends on the locale).
ALTER TABLE api_tokens
    ADD COLUMN name text CHECK (name IS NULL OR length(name) BETWEEN 1 AND 64),
    -- When the token last let a request in, to the minute: a node records a use at most
    -- once a minute per token (src/biz_types/tokens.rs), not a write per request.
    ADD COLUMN last_used_at timestamptz;

-- When the user last signed in to the console; NULL: not since this release.
ALTER TABLE users ADD COLUMN last_sign_in_at timestamptz;

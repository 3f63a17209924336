-- Console sign-in through OpenID Connect (issue 38). Expand only: a new table, and two
-- nullable columns without a default on `users`, which the previous release neither reads
-- nor writes (its sign-in reads `password_hash`, which an OIDC user holds as `!oidc`, no
-- password's hash: see src/users/oidc.rs).

-- The identity a user signed in with, for users created by a sign-in through the OpenID
-- Provider: its issuer and the subject (`sub`) it gave them, which never changes, where
-- their name may. Both or neither: a local user has neither.
-- Locks: users ACCESS EXCLUSIVE, briefly (no rewrite: nullable, no default).
ALTER TABLE users
    ADD COLUMN oidc_issuer text,
    ADD COLUMN oidc_subject text,
    ADD CONSTRAINT users_oidc_both CHECK ((oidc_issuer IS NULL) = (oidc_subject IS NULL));

-- One user per identity. Built on a table of a few rows at most a few thousand: in the
-- migration's transaction, not concurrently.
CREATE UNIQUE INDEX users_oidc_identity_key ON users (oidc_issuer, oidc_subject) WHERE oidc_issuer IS NOT NULL;

-- Sign-ins under way: made when the console sends a browser to the provider, taken (deleted)
-- when it comes back, so that each is used once. `state` is the random value the browser
-- carries there and back (in the URL and in a cookie of ours); the nonce and the PKCE
-- verifier stay here, never leave chime but as the provider's own checks need.
-- Locks: none on existing tables.
CREATE TABLE oidc_sign_ins (
    state         text PRIMARY KEY,
    nonce         text NOT NULL,
    pkce_verifier text NOT NULL,
    -- The console page to go to once signed in.
    next          text NOT NULL,
    expires_at    timestamptz NOT NULL
);

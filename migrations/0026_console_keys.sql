-- Keys the nodes share for the console (issue 33): `login` signs the sign-in form's token,
-- so that a cookie and form field a client made up together are refused (the token was a
-- plain double-submit: any equal pair passed). Made by the first node that needs it, with
-- INSERT ... ON CONFLICT DO NOTHING, and never changed by chime; deleting the row makes the
-- nodes that start afterwards make a new one (open sign-in forms then need a reload).
--
-- Expand: a new table, which the previous release neither reads nor writes.
-- Locks: none on existing tables.
CREATE TABLE console_keys (
    purpose     text PRIMARY KEY,
    key         bytea NOT NULL CHECK (length(key) = 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);

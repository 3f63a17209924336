-- A user name is one name in any case (issue 33): `helen` and `HELEN` could both exist, and
-- a person signing in had to remember which. chime now looks names up by lower(username),
-- and this index keeps two from differing in case only.
--
-- Names that already differ only in case: the oldest user (lowest id) keeps its name; each
-- other is renamed `<name>-<id>` (its name cut to fit the 64 characters a name may have),
-- keeping its password, role and sessions, and the rename is written to the audit log
-- (action `user.rename`, actor `chime`, the old name in `before`) so that the operator can
-- tell those people their new name. Nobody is deleted or locked out.
--
-- Expand by the rule of migrations/README.md: the previous release's inserts name
-- `username` as their ON CONFLICT arbiter, whose unique constraint stays; a name it would
-- create that differs from another only in case is now refused by this index (an error
-- there, where it used to make a second user).
--
-- Locks: users in SHARE ROW EXCLUSIVE mode until the commit (reads go on; sign-in's
-- `last_sign_in_at` update and any user change wait), so that no such pair can be made
-- between the renames and the index. The table holds people, not tasks: milliseconds.
LOCK TABLE users IN SHARE ROW EXCLUSIVE MODE;

WITH twins AS (
    SELECT id, username AS old_name, left(username, 63 - length(id::text)) || '-' || id AS new_name
      FROM users u
     WHERE EXISTS (SELECT 1 FROM users o WHERE lower(o.username) = lower(u.username) AND o.id < u.id)
), renamed AS (
    UPDATE users u SET username = twins.new_name FROM twins WHERE u.id = twins.id
    RETURNING twins.old_name, twins.new_name
)
INSERT INTO audit_log (actor, action, target_type, target, before, after)
SELECT 'chime', 'user.rename', 'user', new_name, jsonb_build_object('name', old_name),
       jsonb_build_object('name', new_name, 'why', 'user names no longer differ by case only')
  FROM renamed;

CREATE UNIQUE INDEX users_username_lower_key ON users (lower(username));

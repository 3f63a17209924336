SET lock_timeout = '5s';

-- New biz types retry for at least 24 hours (60 attempts, 1 s doubling to 1 h, jitter over
-- the upper half: 24.1 to 48.1 h). Existing rows keep their settings: only the defaults
-- change, which takes a brief ACCESS EXCLUSIVE lock on biz_types and rewrites no rows.
ALTER TABLE biz_types ALTER COLUMN max_attempts SET DEFAULT 60;

-- The tasks a key held before its current one: a create with `"on_conflict": "replace"`
-- that finds the key's task finished gives the key to a new task and appends the old
-- task's id here, so the console can show the key's history without an index on
-- `tasks.key`. A constant default: no rewrite, a brief ACCESS EXCLUSIVE lock on task_keys;
-- the previous release's inserts get the empty array.
ALTER TABLE task_keys ADD COLUMN earlier uuid[] NOT NULL DEFAULT '{}';

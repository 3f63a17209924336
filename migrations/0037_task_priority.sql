-- Priority inside a biz type (docs/design/claim.md, Priority): 0 to 9, 9 the most urgent,
-- 5 unless the task was created with another. The claim takes a biz type's due tasks of
-- higher priority first; the API refuses values outside 0-9 (no CHECK here: adding one
-- would read every retained task under the tables' ACCESS EXCLUSIVE lock).
--
-- Expand only: columns with a constant default (no rewrite; a brief ACCESS EXCLUSIVE lock on
-- each table for the catalog change). The previous release neither reads nor writes it; a
-- task it moves (a reschedule, a snooze into cold storage) is written back at 5.
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 5;
-- Same columns, same order: cold rows move into `tasks` with `SELECT *`.
ALTER TABLE tasks_cold ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 5;

-- A view's `*` was expanded when it was made: made again to carry the new column.
CREATE OR REPLACE VIEW all_tasks AS
    SELECT * FROM tasks
    UNION ALL
    SELECT * FROM tasks_cold;

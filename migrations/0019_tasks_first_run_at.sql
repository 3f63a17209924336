-- When a task was first due, kept through reschedules, replays, retries and snoozes so the
-- console can show it beside the current `run_at` (issue 16). Set by the insert, copied by
-- every statement that moves a row; NULL for rows made before this migration (and for
-- rows a previous release's node moves during a rolling upgrade): the page then says it
-- is not known. Expand only: nullable columns (no rewrite, a brief ACCESS EXCLUSIVE lock
-- on each table for the catalog change).
ALTER TABLE tasks ADD COLUMN first_run_at timestamptz;
-- Same columns, same order: cold rows move into `tasks` with `SELECT *`.
ALTER TABLE tasks_cold ADD COLUMN first_run_at timestamptz;

-- A view's `*` was expanded when it was made: made again to carry the new column.
CREATE OR REPLACE VIEW all_tasks AS
    SELECT * FROM tasks
    UNION ALL
    SELECT * FROM tasks_cold;

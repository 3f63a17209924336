-- A cap on what one task can accumulate: a receiver answering `Chime-Snooze` every second
-- added an attempt a second for ever (snoozes do not count toward max_attempts), 86,400 a
-- day. `biz_types.max_snoozes`: snoozes a task may take since it was created or last
-- replayed; the next one ends it failed. `snoozes`: how many it has taken, counted by the
-- statements that settle a snooze (src/tasks/sql/record_tasks.sql, later_cold.sql) and
-- reset by a replay; a previous release's node, which copies a row without it, starts it
-- again from 0, which only lets a task snooze longer.
--
-- Expand only: columns with a constant default (no rewrite; a brief ACCESS EXCLUSIVE lock on
-- each table for the catalog change). The previous release neither reads nor writes them.
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS max_snoozes integer NOT NULL DEFAULT 10000
    CHECK (max_snoozes BETWEEN 0 AND 100000);
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS snoozes integer NOT NULL DEFAULT 0;
-- Same columns, same order: cold rows move into `tasks` with `SELECT *`.
ALTER TABLE tasks_cold ADD COLUMN IF NOT EXISTS snoozes integer NOT NULL DEFAULT 0;

-- A view's `*` was expanded when it was made: made again to carry the new column.
CREATE OR REPLACE VIEW all_tasks AS
    SELECT * FROM tasks
    UNION ALL
    SELECT * FROM tasks_cold;

-- The audited changes of each task (replay, cancel, release, reschedule, and the bulk
-- operations that took it): a row per task and audit entry, written in the transaction of
-- the change, which the console's task history reads by task id. A bulk operation is one
-- entry of the log, and a row here for each task it changed, rather than a list of ids in
-- the entry. `at` is when the change was made to this task (a bulk operation's batches
-- follow one another). Rows go with their tasks: retiring a partition past retention
-- deletes those of its tasks (`placement::forget`).
--
-- Expand only: a new table; the previous release neither reads nor writes it.
-- Locks: the foreign key takes a SHARE ROW EXCLUSIVE lock on audit_log for the statement
-- (audit writes wait that long; the new table is empty, so there is nothing to check).
CREATE TABLE IF NOT EXISTS task_events (
    task_id   uuid NOT NULL,
    audit_id  bigint NOT NULL REFERENCES audit_log (id),
    at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, audit_id)
);

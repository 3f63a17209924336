-- A task's life controlled by its business (SPEC §11, §12): deadlines and the `expired`
-- state, trace context, snoozed attempts, failure notices, and signing secrets that
-- rotate with an overlap. Expand only: nullable columns (no rewrite, a brief ACCESS
-- EXCLUSIVE lock on each table for the catalog change), a new table, and CHECKs widened.

-- When a task is no longer worth delivering: no callback starts at or after it, and a
-- task still undelivered then ends `expired`. NULL: no deadline.
ALTER TABLE tasks ADD COLUMN expires_at timestamptz;
-- The W3C trace context the create carried, sent on (same trace) with every callback.
ALTER TABLE tasks ADD COLUMN traceparent text;
-- Same columns, same order: cold rows move into `tasks` with `SELECT *`.
ALTER TABLE tasks_cold ADD COLUMN expires_at timestamptz, ADD COLUMN traceparent text;

-- A view's `*` was expanded when it was made: made again to carry the new columns.
CREATE OR REPLACE VIEW all_tasks AS
    SELECT * FROM tasks
    UNION ALL
    SELECT * FROM tasks_cold;

-- The states widened with `expired` (terminal, like failed). The old CHECKs are dropped and
-- the new ones added NOT VALID: existing rows are not scanned under this transaction's
-- ACCESS EXCLUSIVE lock; 0013 validates them under a lock that lets reads and writes
-- through. NOT VALID still holds every row written from now on, partitions included.
-- A previous release's node reading an expired task fails on the unknown state (its list
-- or look-up answers 500) until it is upgraded; it never writes one.
ALTER TABLE tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled', 'expired')) NOT VALID;
ALTER TABLE tasks DROP CONSTRAINT tasks_check1;
ALTER TABLE tasks ADD CONSTRAINT tasks_finished_check
    CHECK ((status IN ('succeeded', 'failed', 'cancelled', 'expired')) = (finished_at IS NOT NULL)) NOT VALID;
ALTER TABLE tasks_cold DROP CONSTRAINT tasks_status_check;
ALTER TABLE tasks_cold ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled', 'expired')) NOT VALID;
ALTER TABLE tasks_cold DROP CONSTRAINT tasks_check1;
ALTER TABLE tasks_cold ADD CONSTRAINT tasks_finished_check
    CHECK ((status IN ('succeeded', 'failed', 'cancelled', 'expired')) = (finished_at IS NOT NULL)) NOT VALID;

-- An attempt answered 2xx with `Chime-Snooze`: the task went back to pending, due then.
ALTER TABLE attempts ADD COLUMN snoozed_until timestamptz;

-- Where to POST a signed notice when a task ends failed or expired (NULL: nowhere).
ALTER TABLE biz_types ADD COLUMN failure_url text CHECK (failure_url ~ '^https?://');
-- The signing secret before the last rotation, written as `signing_secret_sealed` is
-- (sealed when CHIME_SECRET_KEY is set), and until when callbacks are signed with it too.
ALTER TABLE biz_types ADD COLUMN previous_secret text, ADD COLUMN previous_secret_until timestamptz;

-- Failure notices waiting to be sent, being sent, or done: one per task that ended failed
-- or expired in a biz type with a failure_url, inserted by the statement that ended it.
-- Sent and retried like a callback, by the biz type's timeout, attempts and backoff.
CREATE TABLE failure_notices (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    biz_type_id      integer NOT NULL REFERENCES biz_types (id) ON DELETE CASCADE,
    task_id          uuid NOT NULL,
    event            text NOT NULL CHECK (event IN ('task.failed', 'task.expired')),
    status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'delivered', 'failed')),
    attempt_count    integer NOT NULL DEFAULT 0,
    -- when it is due (pending), or until when its sender holds it (running)
    due_at           timestamptz NOT NULL DEFAULT now(),
    -- the node sending it (running): only it records the result, so a sender whose hold
    -- ran out cannot write over the node that took the notice after it
    held_by          uuid,
    last_status_code smallint,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
);
CREATE INDEX failure_notices_due_idx ON failure_notices (due_at) WHERE status IN ('pending', 'running');
CREATE INDEX failure_notices_task_idx ON failure_notices (task_id);

-- Less WAL per delivered task (measured with `chime bench --scenarios burst`, which reports
-- WAL per task; docs/book/src/design/storage.md). A task's row is updated twice on its way
-- (claimed, then recorded), and each update is a new row version with an entry in every
-- index whose condition it meets: PostgreSQL cannot update in place (HOT) a row whose
-- status appears in an index's condition.
--
-- 1. Room on the page for a task's two updates. With the pages full, each new version went
--    to another page: the WAL record carried the whole row (payload included) and a lock
--    record besides. Half-full pages keep the new version beside the old one, and
--    PostgreSQL then logs only the bytes that changed. A task partition's pages are
--    rewritten within minutes anyway (claim and record), so they end as full as before.
--    For the partitions that exist (their future pages; a brief SHARE UPDATE EXCLUSIVE lock
--    each, which blocks no read or write); `partitions::ensure` makes new ones so.
--
-- 2. Indexes a claim need not touch: the list of tasks that are neither pending nor
--    running (which replaces tasks_list_idx, `status <> 'pending'`: the few running tasks
--    are listed through tasks_running_idx), and the payload search without running tasks
--    (which replaces tasks_payload_idx). Each took an entry at every claim, for a row that
--    is running for a few milliseconds. src/tasks/queries.rs lists and counts pending,
--    running and finished tasks as three walks, each implying one index's condition.
--
-- Both are made `ON ONLY` the parent, as 0015 and 0022 do (migrations/README.md): the
-- leader's `partitions::complete_indexes` builds each partition's concurrently and attaches
-- it, and once one is valid drops the index it replaces (`partitions::REPLACED`), so that
-- lists and searches keep an index throughout. Brief locks on the parent.
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'tasks'::regclass LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 50)', part);
    END LOOP;
END
$$;

CREATE INDEX IF NOT EXISTS tasks_finished_list_idx ON ONLY tasks (biz_type_id, run_at, id)
    WHERE status NOT IN ('pending', 'running');
CREATE INDEX IF NOT EXISTS tasks_payload_resting_idx ON ONLY tasks USING gin (payload jsonb_path_ops)
    WHERE status <> 'running';

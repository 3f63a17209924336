-- Flow keys (docs/design/claim.md, Flow keys and order by key): a task may name the
-- merchant, user or destination it is for, and a biz type may cap how many tasks of one
-- key are in flight at once across the cluster (`flow_max_in_flight`, 0: no cap) or deliver
-- each key's tasks one at a time, in order (`ordered`).
--
-- Expand only: a nullable column and columns with constant defaults (no rewrite; a brief
-- ACCESS EXCLUSIVE lock on each table for the catalog change). The previous release neither
-- reads nor writes them: its claims ignore the per-key limits, and a task it moves (a
-- snooze into cold storage) loses its flow key.
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS flow_key text;
-- Same columns, same order: cold rows move into `tasks` with `SELECT *`.
ALTER TABLE tasks_cold ADD COLUMN IF NOT EXISTS flow_key text;

CREATE OR REPLACE VIEW all_tasks AS
    SELECT * FROM tasks
    UNION ALL
    SELECT * FROM tasks_cold;

ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS flow_max_in_flight integer NOT NULL DEFAULT 0;
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS ordered boolean NOT NULL DEFAULT false;

-- The pending tasks of each key, in run_at order: the claim walks the keys of a biz type
-- with per-key limits through it, one descent per key, and takes each key's due tasks
-- from its range. Tasks without a flow key are not in it, so a biz type that never names
-- one writes nothing more. Made `ON ONLY` the parent and completed by the leader, as 0038.
CREATE INDEX IF NOT EXISTS tasks_flow_idx ON ONLY tasks (biz_type_id, flow_key, run_at, id)
    WHERE status = 'pending' AND flow_key IS NOT NULL;

-- The tasks that hold a key: those running, and for an ordered biz type a pending one that
-- was tried already (a retry waiting, a snooze): the next of its key waits for it. Small:
-- what is in flight or retrying.
CREATE INDEX IF NOT EXISTS tasks_flow_busy_idx ON ONLY tasks (biz_type_id, flow_key)
    WHERE flow_key IS NOT NULL AND (status = 'running' OR (status = 'pending' AND (attempt_count > 0 OR snoozes > 0)));

-- `chime_flow_room(biz_type, flow_key, cap)`: how many more tasks of the key may be leased
-- now: `cap` less the key's running tasks (an ordered biz type's cap is 1).
--
-- Locks: a transaction-scoped advisory lock on the key, the one-key form (biz type id in
-- the high 32 bits, hashtext of the key in the low), taken with a try: a key another
-- claim is taking right now gets 0 here and waits for the next turn, so claims never
-- wait on each other per key. As in chime_claim_room (0033), the count is a statement of
-- a VOLATILE function, taken after the lock: it sees every lease committed by the claim
-- that held the lock before. Two keys whose hashes collide share the lock: at worst one
-- waits a turn. The count reads at most `cap` entries of tasks_flow_busy_idx.
CREATE OR REPLACE FUNCTION chime_flow_room(biz_type integer, flow text, cap integer) RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    busy integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock((biz_type::bigint << 32) | (hashtext(flow)::bigint & 4294967295)) THEN
        RETURN 0;
    END IF;
    SELECT count(*) INTO busy FROM (
        SELECT 1 FROM tasks WHERE biz_type_id = biz_type AND flow_key = flow AND status = 'running' LIMIT cap
    ) r;
    RETURN greatest(cap - busy, 0);
END
$$;

-- Flow keys (docs/design/claim.md, Flow keys and order by key): a task may name the
-- merchant, user or destination it is for, and a biz type may cap how many tasks of one
-- key are in flight at once across the cluster (`flow_max_in_flight`, 0: no cap), how many
-- start a second (`flow_rate_limit`, NULL: no limit), or deliver each key's tasks one at a
-- time, in order (`ordered`).
--
-- Expand only: a nullable column and columns with constant defaults (no rewrite; a brief
-- ACCESS EXCLUSIVE lock on each table for the catalog change). The previous release neither
-- reads nor writes them: its claims ignore the per-key limits, and a task it moves (a
-- snooze into cold storage) loses its flow key.
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS flow_key text;
-- When a claim last leased the task (set by every claim, whatever its biz type): a key's
-- rate counts its tasks leased within the last window.
ALTER TABLE tasks ADD COLUMN IF NOT EXISTS attempted_at timestamptz;
-- Same columns, same order: cold rows move into `tasks` with `SELECT *`.
ALTER TABLE tasks_cold ADD COLUMN IF NOT EXISTS flow_key text;
ALTER TABLE tasks_cold ADD COLUMN IF NOT EXISTS attempted_at timestamptz;

CREATE OR REPLACE VIEW all_tasks AS
    SELECT * FROM tasks
    UNION ALL
    SELECT * FROM tasks_cold;

ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS flow_max_in_flight integer NOT NULL DEFAULT 0;
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS ordered boolean NOT NULL DEFAULT false;
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS flow_rate_limit double precision;

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

-- The tasks of each key leased lately, for a key's rate: only those with a flow key, and
-- only once leased.
CREATE INDEX IF NOT EXISTS tasks_flow_recent_idx ON ONLY tasks (biz_type_id, flow_key, attempted_at)
    WHERE flow_key IS NOT NULL AND attempted_at IS NOT NULL;

-- `chime_flow_rooms(biz_type, flow_keys, heads, cap, rate)`: for each of the keys, how many
-- more of its tasks may be leased now: `cap` less the key's running tasks (0: no cap), and
-- no more than `rate` a second allows: over a window of a second (1 / rate seconds when
-- rate is below 1), at most rate × window leases, less the key's tasks leased within it
-- (`attempted_at`, which a task's next lease overwrites: a retry within the window counts
-- once). Given the key's `head` (ordered: the task the caller means to take), 1 only if
-- no other task of the key is running or pending after a try (a retry or snooze waiting),
-- else 0. -1: the key's lock is another claim's, which is taking it.
--
-- Locks: a transaction-scoped advisory lock per key, the one-key form (biz type id in the
-- high 32 bits, hashtext of the key in the low), taken with a try: a key another claim is
-- taking right now waits for the next turn, so claims never wait on each other per key.
-- As in chime_claim_room (0033), the counts are a statement of a VOLATILE function of its
-- own, after the locks: it sees every lease committed by the claim that held a lock
-- before, and every outcome recorded since the caller's statement began (its heads may
-- have been read before a retry was recorded). One statement for all the keys: an index
-- scan of tasks_flow_busy_idx (what is running or retrying) and, with a rate, one of
-- tasks_flow_recent_idx, for the keys given. Two keys whose hashes collide share a lock:
-- at worst one waits a turn.
CREATE OR REPLACE FUNCTION chime_flow_rooms(biz_type integer, flow_keys text[], heads uuid[], cap integer, rate double precision)
    RETURNS TABLE (key_of integer, room integer) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    locked text[];
    span double precision := greatest(1.0, 1.0 / nullif(rate, 0));
    allowed integer := greatest(1, floor(coalesce(rate, 0) * greatest(1.0, 1.0 / nullif(rate, 0)))::integer);
BEGIN
    SELECT coalesce(array_agg(f.k), '{}') INTO locked FROM unnest(flow_keys) AS f(k)
     WHERE pg_try_advisory_xact_lock((biz_type::bigint << 32) | (hashtext(f.k)::bigint & 4294967295));
    RETURN QUERY
    SELECT f.i::integer,
           CASE WHEN NOT f.k = ANY(locked) THEN -1
                ELSE greatest(0, least(
                    CASE WHEN f.head IS NOT NULL THEN
                              CASE WHEN EXISTS (SELECT FROM tasks t WHERE t.biz_type_id = biz_type AND t.flow_key = f.k AND t.id <> f.head
                                                   AND (t.status = 'running' OR (t.status = 'pending' AND (t.attempt_count > 0 OR t.snoozes > 0))))
                                   THEN 0 ELSE 1 END
                         WHEN cap > 0 THEN cap - coalesce(busy.n, 0)::integer
                         ELSE 1000000 END,
                    CASE WHEN rate > 0 THEN allowed - coalesce(recent.n, 0)::integer ELSE 1000000 END))
           END
      FROM unnest(flow_keys, heads) WITH ORDINALITY AS f(k, head, i)
      LEFT JOIN (SELECT t.flow_key, count(*) AS n FROM tasks t
                  WHERE cap > 0 AND t.biz_type_id = biz_type AND t.flow_key = ANY(locked) AND t.status = 'running'
                  GROUP BY t.flow_key) busy ON busy.flow_key = f.k
      LEFT JOIN (SELECT t.flow_key, count(*) AS n FROM tasks t
                  WHERE rate > 0 AND t.biz_type_id = biz_type AND t.flow_key = ANY(locked)
                    AND t.attempted_at > clock_timestamp() - span * interval '1 second'
                  GROUP BY t.flow_key) recent ON recent.flow_key = f.k;
END
$$;

-- `chime_flow_head(biz_type, flow_key, floor)`: the task an ordered key delivers next, due
-- or not: the one tried already and pending (a retry or snooze waiting: the key is its
-- until it is settled), else its first pending task by run_at, then id. Two probes:
-- tasks_flow_busy_idx, then tasks_flow_idx. `floor`: chime_unfinished_floor() or NULL.
CREATE OR REPLACE FUNCTION chime_flow_head(biz_type integer, flow text, floor timestamptz)
    RETURNS TABLE (id uuid, run_at timestamptz) LANGUAGE sql STABLE AS $$
    SELECT h.id, h.run_at FROM (
        (SELECT t.id, t.run_at FROM tasks t
          WHERE t.biz_type_id = biz_type AND t.flow_key = flow AND t.status = 'pending'
            AND (t.attempt_count > 0 OR t.snoozes > 0) AND t.run_at >= coalesce(floor, '-infinity')
          LIMIT 1)
        UNION ALL
        (SELECT t.id, t.run_at FROM tasks t
          WHERE t.biz_type_id = biz_type AND t.flow_key = flow AND t.status = 'pending'
            AND t.run_at >= coalesce(floor, '-infinity')
          ORDER BY t.run_at, t.id LIMIT 1)
        LIMIT 1
    ) h
$$;

-- Inserts tasks of biz type $1, given column by column as arrays ($2 to $7: id, key, run_at
-- or delay in ms, payload as JSON text, hash of the request; $9 to $11: the deadline, or
-- its distance in ms from run_at, the traceparent, $12 the priority and $13 the flow key;
-- $8 is the wake channel).
-- `first_run_at` is the run_at it is given here, kept by every later move. Used by single
-- creates (batched), batch creates and replaces; timer occurrences have their own
-- statement, `insert_occurrences.sql`.
--
-- Keys are claimed in task_keys first; an item whose key is taken is not inserted (ON
-- CONFLICT DO NOTHING; a concurrent insert of the same key is waited for until it commits
-- or rolls back) and the caller answers it. An unkeyed item costs task_keys nothing: the
-- key insert sees only keyed rows, and `key IS NULL` passes an unkeyed one before the
-- probe of what it claimed. Each task goes to the hot partitions or to cold storage by the
-- horizon read in this same statement, so it never disagrees with the horizon; a row that
-- lands in cold storage just as the horizon moves past it is picked up by the migrator's
-- next sweep. Locks nothing but the new rows and keys.
--
-- Each insert reads `input` itself rather than through a CTE of the rows to write: a
-- second CTE would copy every row, payload included, once more (measured: 5-10% of the
-- statement with 1000 rows).
WITH input AS (
    SELECT i.id, i.key, coalesce(i.run_at, now() + i.delay_ms * interval '1 millisecond') AS run_at,
           i.payload, i.request_hash, i.expires_at, i.ttl_ms, i.traceparent, i.priority, i.flow_key
      FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::bigint[], $6::text[], $7::bytea[],
                  $9::timestamptz[], $10::bigint[], $11::text[], $12::smallint[], $13::text[])
           AS i(id, key, run_at, delay_ms, payload, request_hash, expires_at, ttl_ms, traceparent, priority, flow_key)
), taken AS (
    INSERT INTO task_keys (biz_type_id, key, task_id, request_hash)
    SELECT $1, key, id, request_hash FROM input WHERE key IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING task_id
), hot AS (
    INSERT INTO tasks (id, biz_type_id, key, run_at, payload, expires_at, traceparent, first_run_at, priority, flow_key)
    SELECT id, $1, key, run_at, payload::jsonb, coalesce(expires_at, run_at + ttl_ms * interval '1 millisecond'),
           traceparent, run_at, priority, flow_key
      FROM input
     WHERE run_at < (SELECT until FROM hot_horizon) AND (key IS NULL OR id IN (SELECT task_id FROM taken))
    RETURNING id, run_at, expires_at, created_at
), cold AS (
    INSERT INTO tasks_cold (id, biz_type_id, key, run_at, payload, expires_at, traceparent, first_run_at, priority, flow_key)
    SELECT id, $1, key, run_at, payload::jsonb, coalesce(expires_at, run_at + ttl_ms * interval '1 millisecond'),
           traceparent, run_at, priority, flow_key
      FROM input
     WHERE run_at >= (SELECT until FROM hot_horizon) AND (key IS NULL OR id IN (SELECT task_id FROM taken))
    RETURNING id, run_at, expires_at, created_at
), wake AS (
    -- Engines sleep until the next due task, at most a second; one due sooner must wake
    -- them (sent on commit, to every node), and this biz type's waiting reserves only
    -- (the payload is wake.rs's `Wake::DueFor`). A boolean rather than pg_notify's void:
    -- Citus keeps a CTE's rows as an intermediate result, which cannot hold a void.
    SELECT pg_notify($8, concat('due:', $1::int)) IS NULL AS told FROM input
     WHERE run_at <= now() + interval '1 second' AND (key IS NULL OR id IN (SELECT task_id FROM taken))
     LIMIT 1
)
-- Only what the database decided is sent back: the rest of each new task is what the
-- caller sent, or a new task's defaults (`Inserted::task`). The join only makes the wake
-- CTE run: an unreferenced CTE is not evaluated, and a LEFT JOIN to it would be removed by
-- the planner (it adds no column and at most one row).
SELECT t.id, t.run_at, t.expires_at, t.created_at
  FROM (SELECT * FROM hot UNION ALL SELECT * FROM cold) t
  CROSS JOIN (SELECT count(*) FROM wake) w

-- Inserts tasks of biz type $1, given column by column as arrays ($2 to $7: id, key, run_at
-- or delay in ms, payload as JSON text, hash of the request; $11 to $13: the deadline, or
-- its distance in ms from run_at, and the traceparent), as occurrences of timer $8 or of
-- none; `first_run_at` is the run_at it is given here, kept by every later move. Used by single creates (batched), batch creates and timer occurrences.
--
-- Keys are claimed in task_keys first; an item whose key is taken is not inserted (ON
-- CONFLICT DO NOTHING; a concurrent insert of the same key is waited for until it commits
-- or rolls back) and the caller answers it. Each task goes to the hot partitions or to
-- cold storage by the horizon read in this same statement, so it never disagrees with
-- the horizon; a row that lands in cold storage just as the horizon moves past it is
-- picked up by the migrator's next sweep. Locks nothing but the new rows and keys.
WITH input AS (
    SELECT i.id, i.key, i.run_at, i.payload, i.request_hash, i.traceparent,
           coalesce(i.expires_at, i.run_at + i.ttl_ms * interval '1 millisecond') AS expires_at
      FROM (SELECT i.id, i.key, coalesce(i.run_at, now() + i.delay_ms * interval '1 millisecond') AS run_at,
                   i.payload::jsonb AS payload, i.request_hash, i.expires_at, i.ttl_ms, i.traceparent
              FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::bigint[], $6::text[], $7::bytea[],
                          $11::timestamptz[], $12::bigint[], $13::text[])
                   AS i(id, key, run_at, delay_ms, payload, request_hash, expires_at, ttl_ms, traceparent)) i
), taken AS (
    INSERT INTO task_keys (biz_type_id, key, task_id, request_hash)
    SELECT $1, key, id, request_hash FROM input WHERE key IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING task_id
), fresh AS (
    SELECT * FROM input WHERE key IS NULL OR id IN (SELECT task_id FROM taken)
), hot AS (
    INSERT INTO tasks (id, biz_type_id, key, run_at, payload, timer_id, expires_at, traceparent, first_run_at)
    SELECT id, $1, key, run_at, payload, $8, expires_at, traceparent, run_at FROM fresh
     WHERE run_at < (SELECT until FROM hot_horizon)
    RETURNING id, key, run_at, status, attempt_count, timer_id, last_error, created_at, updated_at, finished_at,
              expires_at, traceparent
), cold AS (
    INSERT INTO tasks_cold (id, biz_type_id, key, run_at, payload, timer_id, expires_at, traceparent, first_run_at)
    SELECT id, $1, key, run_at, payload, $8, expires_at, traceparent, run_at FROM fresh
     WHERE run_at >= (SELECT until FROM hot_horizon)
    RETURNING id, key, run_at, status, attempt_count, timer_id, last_error, created_at, updated_at, finished_at,
              expires_at, traceparent
), wake AS (
    -- Engines sleep until the next due task, at most a second; one due sooner must wake
    -- them (sent on commit, to every node).
    SELECT pg_notify($10, '') FROM fresh
     WHERE run_at <= now() + interval '1 second' LIMIT 1
)
-- The payloads are not sent back: the caller has them. The join only makes the wake CTE
-- run: an unreferenced CTE is not evaluated, and a LEFT JOIN to it would be removed by the
-- planner (it adds no column and at most one row).
SELECT t.id, $1 AS biz_type_id, $9::text AS biz_type, t.key, t.run_at, 'null'::jsonb AS payload, t.status,
       t.attempt_count, t.timer_id, t.last_error, t.created_at, t.updated_at, t.finished_at, t.expires_at,
       t.traceparent
  FROM (SELECT * FROM hot UNION ALL SELECT * FROM cold) t
  CROSS JOIN (SELECT count(*) FROM wake) w

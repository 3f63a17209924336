-- Inserts timer occurrences of many timers at once, given column by column as arrays
-- ($1 to $6: the timer, its biz type, the task's id, key and run_at, and the hash that
-- tells a repeat of the key from a conflict), each with its timer's payload; $7 is the
-- wake channel. The leader's one statement per pass (`timers::materialize_due`); a
-- client's tasks go through `insert.sql`, which this follows.
--
-- Keys are claimed in task_keys first; an occurrence whose key is taken is not inserted
-- (ON CONFLICT DO NOTHING, waiting for a concurrent insert of the same key to commit or
-- roll back). Each task goes to the hot partitions or to cold storage by the horizon read
-- in this same statement. The payload is read from the timer's row, which the caller holds
-- locked (FOR UPDATE), so it is the payload the occurrences were planned with. Locks
-- nothing but the new rows and keys. Returns how many occurrences each timer got.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::int[], $3::uuid[], $4::text[], $5::timestamptz[], $6::bytea[])
                  AS i(timer_id, biz_type_id, id, key, run_at, request_hash)
), taken AS (
    INSERT INTO task_keys (biz_type_id, key, task_id, request_hash)
    SELECT biz_type_id, key, id, request_hash FROM input
    ON CONFLICT DO NOTHING
    RETURNING task_id
), fresh AS (
    SELECT i.*, t.payload FROM input i JOIN timers t ON t.id = i.timer_id
     WHERE i.id IN (SELECT task_id FROM taken)
), hot AS (
    INSERT INTO tasks (id, biz_type_id, key, run_at, payload, timer_id, first_run_at)
    SELECT id, biz_type_id, key, run_at, payload, timer_id, run_at FROM fresh
     WHERE run_at < (SELECT until FROM hot_horizon)
    RETURNING timer_id
), cold AS (
    INSERT INTO tasks_cold (id, biz_type_id, key, run_at, payload, timer_id, first_run_at)
    SELECT id, biz_type_id, key, run_at, payload, timer_id, run_at FROM fresh
     WHERE run_at >= (SELECT until FROM hot_horizon)
    RETURNING timer_id
), wake AS (
    -- Engines sleep until the next due task, at most a second; one due sooner must wake
    -- them (sent on commit, to every node). A boolean rather than pg_notify's void, as in
    -- insert.sql: Citus keeps a CTE's rows as an intermediate result, which cannot hold a void.
    SELECT pg_notify($7, '') IS NULL AS told FROM fresh
     WHERE run_at <= now() + interval '1 second' LIMIT 1
)
-- The join only makes the wake CTE run (see insert.sql).
SELECT w.timer_id, count(*) AS written
  FROM (SELECT timer_id FROM hot UNION ALL SELECT timer_id FROM cold) w
  CROSS JOIN (SELECT count(*) FROM wake) n
 GROUP BY w.timer_id

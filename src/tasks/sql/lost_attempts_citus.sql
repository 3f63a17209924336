-- The attempts that lease recovery (recover_leases_citus.sql) and a release
-- (release_citus.sql) found lost, on a Citus cluster: tasks $2 of biz type $1, each with its
-- number, start, duration, error and node (None for a pull consumer), as recover_leases.sql
-- and release.sql insert them in a CTE on plain PostgreSQL. It reads no distributed table:
-- Citus routes the rows, all of one biz type, to its shard. Inserts only; locks nothing else.
INSERT INTO attempts (task_id, number, started_at, duration_ms, error, node_id, biz_type_id)
SELECT a.task_id, a.number, a.started_at, a.duration_ms, a.error, a.node_id, $1
  FROM unnest($2::uuid[], $3::int[], $4::timestamptz[], $5::int[], $6::text[], $7::uuid[])
       AS a(task_id, number, started_at, duration_ms, error, node_id)

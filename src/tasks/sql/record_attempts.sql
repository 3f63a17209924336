-- The attempts of a batch of settled leases, one row each, whether or not the lease was
-- still held (a late result is history too). Inserts only; locks nothing else.
INSERT INTO attempts (task_id, number, started_at, duration_ms, status_code, error, response_excerpt, node_id,
                      biz_type_id, lateness_ms, redirected_to, snoozed_until)
SELECT a.task_id, a.number, a.started_at, a.duration_ms, a.status_code, a.error, a.response_excerpt, $8,
       a.biz_type_id, greatest(0, extract(epoch FROM a.started_at - a.run_at) * 1000)::int, a.redirected_to,
       a.snoozed_until
  FROM unnest($1::uuid[], $2::int[], $3::timestamptz[], $4::int[], $5::smallint[], $6::text[], $7::text[],
              $9::int[], $10::timestamptz[], $11::text[], $12::timestamptz[])
       AS a(task_id, number, started_at, duration_ms, status_code, error, response_excerpt, biz_type_id, run_at,
            redirected_to, snoozed_until)

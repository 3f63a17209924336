-- An ordered key's head that a retry or snooze sent beyond the hot horizon (into cold
-- storage, later_cold.sql) holds its key there too: `chime_flow_rooms` (0040) gives an
-- ordered key no room while a tried task of the key waits, pending, in cold storage, found through
-- tasks_cold_flow_tried_idx (0042). Before, the key's next task went at once, out of order.
-- The function is otherwise 0040's; the previous release calls it the same way.
--
-- Locks: none beyond replacing the function (a brief lock on its catalog row).
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
                                     OR EXISTS (SELECT FROM tasks_cold c WHERE c.biz_type_id = biz_type AND c.flow_key = f.k
                                                   AND c.status = 'pending' AND (c.attempt_count > 0 OR c.snoozes > 0))
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

-- The priority branches of pick.sql, in place of its `{by_priority}` (`lease::with_pick`):
-- for a biz type with a due task of another priority than 5 (`x.prioritized`), `oldest`
-- of its longest-due tasks whatever their priority, then each priority from 9 to 0 (ord 1
-- to 10), in run_at order (pick.sql says how). Apart because a claim that leaves them
-- out is cheaper even when they would not run: every branch is an Append over the
-- partitions of `tasks`, which PostgreSQL opens, locks and prepares as each statement
-- starts (with 30 days of daily partitions, a claim took 1.1 ms with them, 0.5 ms without).
        UNION ALL
        (SELECT id, run_at, ord FROM (
            SELECT DISTINCT ON (id) id, run_at, ord FROM (
                (SELECT id, run_at, 0 AS ord FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND x.prioritized
                      ORDER BY run_at LIMIT w.oldest FOR UPDATE SKIP LOCKED) o)
                UNION ALL
                (SELECT id, run_at, 1 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 9 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l9)
                UNION ALL
                (SELECT id, run_at, 2 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 8 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l8)
                UNION ALL
                (SELECT id, run_at, 3 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 7 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l7)
                UNION ALL
                (SELECT id, run_at, 4 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 6 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l6)
                UNION ALL
                (SELECT id, run_at, 5 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 5 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l5)
                UNION ALL
                (SELECT id, run_at, 6 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 4 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l4)
                UNION ALL
                (SELECT id, run_at, 7 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 3 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l3)
                UNION ALL
                (SELECT id, run_at, 8 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 2 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l2)
                UNION ALL
                (SELECT id, run_at, 9 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 1 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l1)
                UNION ALL
                (SELECT id, run_at, 10 FROM (SELECT id, run_at FROM tasks WHERE biz_type_id = w.biz_type_id AND status = 'pending'
                   AND run_at <= now() + w.ahead_ms * interval '1 millisecond' AND run_at >= coalesce($6, '-infinity') AND priority = 0 AND x.prioritized
                      ORDER BY run_at LIMIT w.n FOR UPDATE SKIP LOCKED) l0)
                LIMIT w.n + w.oldest) u
             ORDER BY id, ord) d
          ORDER BY ord, run_at LIMIT w.n)

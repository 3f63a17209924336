-- The `picked` CTE of claim.sql (`{pick}`, `lease::with_pick`) for biz types with per-key
-- limits (docs/design/claim.md, Flow keys and order by key): `flow_max_in_flight`, or
-- `ordered` (one at a time per key, in run_at order), or `flow_rate_limit`. $8 to $11
-- hold, per biz type of $1, the key's cap (1 when ordered, 0: none), whether it is ordered,
-- where the last claim's walk of its keys stopped (NULL: at the start), and the key's rate
-- (NULL: none).
--
-- The keys a claim looks at: those of the biz type's first n due tasks in run_at order
-- (tasks_claim_idx; tasks without a flow key among them are taken as they come), and up to
-- KEY_WALK more with due work after the cursor, in key order (a loose scan of
-- tasks_flow_idx, one descent per key): a herd of one key at the head of the due order
-- holds back no other key, since the walk goes round all of them over the claims. Each
-- key's room is chime_flow_room's (migration 0040: a try-lock on the key, then its running
-- tasks and those leased within its rate's window counted); it takes that many of its due
-- tasks in run_at order, or, ordered, its head: the task already tried and waiting for its
-- retry, else its first pending task, and that only when due. Nothing here is read or written per key without due work.
--
-- Priority is not applied here: a biz type with per-key limits takes each key's tasks in
-- run_at order.
flows AS (
    SELECT w.biz_type_id, w.n, w.ahead_ms, f.cap, f.ordered, f.cursor, f.rate,
           now() + w.ahead_ms * interval '1 millisecond' AS due_by
      FROM wants w
      JOIN unnest($1::int[], $8::int[], $9::bool[], $10::text[], $11::float8[]) AS f(biz_type_id, cap, ordered, cursor, rate)
           USING (biz_type_id)
), head AS (
    SELECT fl.biz_type_id, h.id, h.run_at, h.flow_key
      FROM flows fl
     CROSS JOIN LATERAL (
        SELECT id, run_at, flow_key FROM tasks
         WHERE biz_type_id = fl.biz_type_id AND status = 'pending' AND run_at <= fl.due_by AND run_at >= coalesce($6, '-infinity')
         ORDER BY run_at LIMIT fl.n
     ) h
), walk AS (
    -- KEY_WALK (64) keys after the cursor, each the next key of tasks_flow_idx with a due
    -- task: one descent each (the run_at bound is checked inside the index).
    SELECT fl.biz_type_id, s.flow_key, s.i
      FROM flows fl
     CROSS JOIN LATERAL (
        WITH RECURSIVE scan(flow_key, i) AS (
            SELECT (SELECT flow_key FROM tasks
                     WHERE biz_type_id = fl.biz_type_id AND status = 'pending' AND flow_key > coalesce(fl.cursor, '')
                       AND run_at <= fl.due_by AND run_at >= coalesce($6, '-infinity')
                     ORDER BY flow_key LIMIT 1), 1
            UNION ALL
            SELECT (SELECT t.flow_key FROM tasks t
                     WHERE t.biz_type_id = fl.biz_type_id AND t.status = 'pending' AND t.flow_key > scan.flow_key
                       AND t.run_at <= fl.due_by AND t.run_at >= coalesce($6, '-infinity')
                     ORDER BY t.flow_key LIMIT 1), scan.i + 1
              FROM scan WHERE scan.flow_key IS NOT NULL AND scan.i < 64
        )
        SELECT flow_key, i FROM scan WHERE flow_key IS NOT NULL
     ) s
), rooms AS (
    -- Each key once, those of the head first. Ordered, its head first: the task tried
    -- already (a retry or snooze waiting) if there is one, else its first pending task,
    -- due or not. Then its room, counted under its lock: for an ordered key, 1 only if no
    -- task of it but the head is running or tried and pending, as read after the lock (the
    -- head was read before it, so that a task settled or retried in between is seen).
    SELECT k.biz_type_id, k.flow_key, k.pos, o.id AS head_id, o.run_at AS head_run_at,
           chime_flow_room(k.biz_type_id, k.flow_key, fl.cap, fl.rate, o.id) AS room
      FROM (SELECT DISTINCT ON (biz_type_id, flow_key) biz_type_id, flow_key, pos
              FROM (SELECT biz_type_id, flow_key, 0 AS pos FROM head WHERE flow_key IS NOT NULL
                    UNION ALL
                    SELECT biz_type_id, flow_key, i FROM walk) u
             ORDER BY biz_type_id, flow_key, pos) k
      JOIN flows fl USING (biz_type_id)
      LEFT JOIN LATERAL (
        SELECT id, run_at FROM (
            (SELECT id, run_at FROM tasks
              WHERE fl.ordered AND biz_type_id = k.biz_type_id AND flow_key = k.flow_key AND status = 'pending'
                AND (attempt_count > 0 OR snoozes > 0) AND run_at >= coalesce($6, '-infinity')
              LIMIT 1)
            UNION ALL
            (SELECT id, run_at FROM tasks
              WHERE fl.ordered AND biz_type_id = k.biz_type_id AND flow_key = k.flow_key AND status = 'pending'
                AND run_at >= coalesce($6, '-infinity')
              ORDER BY run_at, id LIMIT 1)
            LIMIT 1
        ) h
      ) o ON true
     WHERE NOT fl.ordered OR o.id IS NOT NULL
), chosen AS (
    SELECT c.biz_type_id, c.id, c.run_at,
           row_number() OVER (PARTITION BY c.biz_type_id ORDER BY c.pos, c.run_at) AS rank
      FROM (
        SELECT biz_type_id, id, run_at, 0 AS pos FROM head WHERE flow_key IS NULL
        UNION ALL
        -- Ordered: the key's head, if due.
        SELECT r.biz_type_id, r.head_id, r.head_run_at, r.pos
          FROM rooms r JOIN flows fl USING (biz_type_id)
         WHERE fl.ordered AND r.room > 0 AND r.head_run_at <= fl.due_by
        UNION ALL
        SELECT r.biz_type_id, t.id, t.run_at, r.pos
          FROM rooms r
          JOIN flows fl USING (biz_type_id)
         CROSS JOIN LATERAL (
            SELECT id, run_at FROM tasks
             WHERE biz_type_id = r.biz_type_id AND flow_key = r.flow_key AND status = 'pending'
               AND run_at <= fl.due_by AND run_at >= coalesce($6, '-infinity')
             ORDER BY run_at, id LIMIT r.room
         ) t
         WHERE NOT fl.ordered AND r.room > 0
      ) c
), picked AS (
    -- Locked as the plain pick locks, rows another claim took since being skipped: its
    -- `status` is checked again on the locked row.
    SELECT c.biz_type_id, t.id, t.run_at, 5 AS ord
      FROM chosen c
      JOIN flows fl USING (biz_type_id)
      JOIN LATERAL (
        SELECT id, run_at FROM tasks
         WHERE id = c.id AND run_at = c.run_at AND status = 'pending'
         FOR UPDATE SKIP LOCKED
      ) t ON true
     WHERE c.rank <= fl.n
), held AS (
    -- Per biz type: whether a key with due work had no room (the engine then looks again
    -- shortly, rather than at once), and where the next claim's walk starts.
    SELECT fl.biz_type_id,
           EXISTS (SELECT FROM rooms r WHERE r.biz_type_id = fl.biz_type_id AND r.room = 0) AS held,
           (SELECT w.flow_key FROM walk w WHERE w.biz_type_id = fl.biz_type_id AND w.i = 64) AS cursor
      FROM flows fl
)

-- The `picked` CTE of claim.sql (`{pick}`, `lease::with_pick`) for biz types with per-key
-- limits (docs/design/claim.md, Flow keys and order by key): `flow_max_in_flight`, or
-- `ordered` (one at a time per key, in run_at order), or `flow_rate_limit`. $9 to $12
-- hold, per biz type of $1, the key's cap (1 when ordered, 0: none), whether it is ordered,
-- where the last claim's walk of its keys stopped (NULL: at the start), and the key's rate
-- (NULL: none).
--
-- The keys a claim looks at: those of the biz type's first n due tasks in run_at order
-- (tasks_claim_idx; tasks without a flow key among them are taken as they come), and, when
-- those leave it short of n, up to KEY_WALK more with due work after the cursor, in key
-- order (a loose scan of tasks_flow_idx, one descent per key): a herd of one key at the
-- head of the due order holds back no other key, since the walk goes round all of them
-- over the claims. The keys' rooms are chime_flow_rooms's (migration 0040: a try-lock on
-- each key, then their running tasks and those leased within the rate's window counted,
-- in one statement for all of them). A key of the head gives its tasks there up to its
-- room; a key of the walk, that many of its due tasks in run_at order. Ordered, a key gives its head (`chime_flow_head`: the task
-- already tried and waiting for its retry, else its first pending task), and that only
-- when due. Nothing here is read or written per key without due work.
--
-- Priority is not applied here: a biz type with per-key limits takes each key's tasks in
-- run_at order.
flows AS (
    SELECT w.biz_type_id, w.n, w.ahead_ms, f.cap, f.ordered, f.cursor, f.rate,
           now() + w.ahead_ms * interval '1 millisecond' AS due_by
      FROM wants w
      JOIN unnest($1::int[], $9::int[], $10::bool[], $11::text[], $12::float8[]) AS f(biz_type_id, cap, ordered, cursor, rate)
           USING (biz_type_id)
), head AS (
    -- The first n due tasks, each numbered within its key.
    SELECT fl.biz_type_id, h.id, h.run_at, h.flow_key,
           row_number() OVER (PARTITION BY fl.biz_type_id, h.flow_key ORDER BY h.run_at, h.id) AS nth
      FROM flows fl
     CROSS JOIN LATERAL (
        -- Locked, as the plain pick's rows are, so that another node's claim passes over
        -- them to the next due tasks (and their keys) rather than find the same keys
        -- locked. Rows a key's limit leaves stay locked, unchanged, until the claim ends.
        SELECT id, run_at, flow_key FROM tasks
         WHERE biz_type_id = fl.biz_type_id AND status = 'pending' AND run_at <= fl.due_by AND run_at >= coalesce($6, '-infinity')
         ORDER BY run_at LIMIT fl.n
         FOR UPDATE SKIP LOCKED
     ) h
), head_keys AS (
    -- The head's keys, each once, numbered per biz type; ordered, with its head task (see
    -- `chime_flow_head`).
    SELECT k.biz_type_id, k.flow_key, o.id AS head_id, o.run_at AS head_run_at,
           row_number() OVER (PARTITION BY k.biz_type_id ORDER BY k.flow_key) AS i
      FROM (SELECT DISTINCT biz_type_id, flow_key FROM head WHERE flow_key IS NOT NULL) k
      JOIN flows fl USING (biz_type_id)
      LEFT JOIN LATERAL chime_flow_head(k.biz_type_id, k.flow_key, $6) o ON fl.ordered
     WHERE NOT fl.ordered OR o.id IS NOT NULL
), head_counted AS (
    -- Their rooms, one call per biz type (a CTE: called once).
    SELECT fl.biz_type_id, x.key_of, x.room
      FROM flows fl
     CROSS JOIN LATERAL chime_flow_rooms(
        fl.biz_type_id,
        ARRAY(SELECT k.flow_key FROM head_keys k WHERE k.biz_type_id = fl.biz_type_id ORDER BY k.i),
        ARRAY(SELECT k.head_id FROM head_keys k WHERE k.biz_type_id = fl.biz_type_id ORDER BY k.i),
        fl.cap, fl.rate) x
), head_rooms AS (
    SELECT k.biz_type_id, k.flow_key, 0 AS pos, k.head_id, k.head_run_at, c.room
      FROM head_keys k JOIN head_counted c ON c.biz_type_id = k.biz_type_id AND c.key_of = k.i
), from_head AS (
    -- What the head gives: its tasks without a flow key; of each key, its first tasks
    -- there up to its room; of an ordered key, its head task if due.
    SELECT h.biz_type_id, h.id, h.run_at, 0 AS pos FROM head h WHERE h.flow_key IS NULL
    UNION ALL
    SELECT h.biz_type_id, h.id, h.run_at, 0
      FROM head h JOIN head_rooms r USING (biz_type_id, flow_key) JOIN flows fl USING (biz_type_id)
     WHERE NOT fl.ordered AND h.nth <= r.room
    UNION ALL
    SELECT r.biz_type_id, r.head_id, r.head_run_at, 0
      FROM head_rooms r JOIN flows fl USING (biz_type_id)
     WHERE fl.ordered AND r.room > 0 AND r.head_run_at <= fl.due_by
), short AS (
    -- The biz types the head left short of what they may take: keys beyond it may have
    -- due work that a herd of the head's keys hides.
    SELECT fl.* FROM flows fl
     WHERE (SELECT count(*) FROM from_head f WHERE f.biz_type_id = fl.biz_type_id) < fl.n
), walk AS (
    -- KEY_WALK (64) keys after the cursor, each the next key of tasks_flow_idx with a due
    -- task: one descent each (the run_at bound is checked inside the index).
    SELECT fl.biz_type_id, s.flow_key, s.i
      FROM short fl
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
), walk_keys AS (
    -- The walk's keys not in the head, numbered, as head_keys.
    SELECT w.biz_type_id, w.flow_key, w.i AS pos, o.id AS head_id, o.run_at AS head_run_at,
           row_number() OVER (PARTITION BY w.biz_type_id ORDER BY w.i) AS i
      FROM walk w
      JOIN flows fl USING (biz_type_id)
      LEFT JOIN LATERAL chime_flow_head(w.biz_type_id, w.flow_key, $6) o ON fl.ordered
     WHERE NOT EXISTS (SELECT FROM head_keys k WHERE k.biz_type_id = w.biz_type_id AND k.flow_key = w.flow_key)
       AND (NOT fl.ordered OR o.id IS NOT NULL)
), walk_counted AS (
    SELECT fl.biz_type_id, x.key_of, x.room
      FROM short fl
     CROSS JOIN LATERAL chime_flow_rooms(
        fl.biz_type_id,
        ARRAY(SELECT k.flow_key FROM walk_keys k WHERE k.biz_type_id = fl.biz_type_id ORDER BY k.i),
        ARRAY(SELECT k.head_id FROM walk_keys k WHERE k.biz_type_id = fl.biz_type_id ORDER BY k.i),
        fl.cap, fl.rate) x
), walk_rooms AS (
    SELECT k.biz_type_id, k.flow_key, k.pos, k.head_id, k.head_run_at, c.room
      FROM walk_keys k JOIN walk_counted c ON c.biz_type_id = k.biz_type_id AND c.key_of = k.i
), chosen AS (
    SELECT c.biz_type_id, c.id, c.run_at,
           row_number() OVER (PARTITION BY c.biz_type_id ORDER BY c.pos, c.run_at) AS rank
      FROM (
        SELECT * FROM from_head
        UNION ALL
        SELECT r.biz_type_id, r.head_id, r.head_run_at, r.pos
          FROM walk_rooms r JOIN flows fl USING (biz_type_id)
         WHERE fl.ordered AND r.room > 0 AND r.head_run_at <= fl.due_by
        UNION ALL
        SELECT r.biz_type_id, t.id, t.run_at, r.pos
          FROM walk_rooms r
          JOIN flows fl USING (biz_type_id)
         CROSS JOIN LATERAL (
            SELECT id, run_at FROM tasks
             WHERE biz_type_id = r.biz_type_id AND flow_key = r.flow_key AND status = 'pending'
               AND run_at <= fl.due_by AND run_at >= coalesce($6, '-infinity')
             ORDER BY run_at, id LIMIT greatest(r.room, 0)
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
           -- (-1: the key's lock was another claim's, which is taking it: not held.)
           EXISTS (SELECT FROM head_rooms r WHERE r.biz_type_id = fl.biz_type_id AND r.room = 0)
           OR EXISTS (SELECT FROM walk_rooms r WHERE r.biz_type_id = fl.biz_type_id AND r.room = 0) AS held,
           -- No walk: it goes on from where it was.
           CASE WHEN fl.biz_type_id IN (SELECT biz_type_id FROM short)
                THEN (SELECT w.flow_key FROM walk w WHERE w.biz_type_id = fl.biz_type_id AND w.i = 64)
                ELSE fl.cursor END AS cursor
      FROM flows fl
)

-- The rows claim.sql adds, in place of its `{markers}`, when its pick is pick_flow.sql: per
-- biz type, one with id all zeros saying whether a key's limit held back due tasks
-- (`capped`) and where the next claim's walk of its keys starts (`cursor`); none when
-- neither.
UNION ALL
SELECT '00000000-0000-0000-0000-000000000000', h.biz_type_id, NULL, NULL, now(), '', 0, NULL, NULL, NULL, false,
       clock_timestamp(), h.held, h.cursor, NULL, false
  FROM held h
 WHERE h.held OR h.cursor IS NOT NULL

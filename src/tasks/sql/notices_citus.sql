-- The failure and chat notices of the tasks $2 of biz type $1 that a statement on a Citus
-- cluster ended (claim_citus.sql: expired; record_citus.sql: failed or expired), each with
-- its event $3 (`task.failed`, `task.expired`), in that statement's transaction: what the
-- `notices` and `chat` CTEs of claim.sql and record_tasks.sql insert on plain PostgreSQL
-- (Citus would split such a CTE into steps through the coordinator). Only for a biz type
-- that wants them (a failure_url, a chat_url), as there. Locks nothing but the new rows.
WITH b AS (
    SELECT failure_url, chat_url FROM biz_types WHERE id = $1
), notices AS (
    INSERT INTO failure_notices (biz_type_id, task_id, event)
    SELECT $1, t.id, t.event FROM unnest($2::uuid[], $3::text[]) AS t(id, event), b WHERE b.failure_url IS NOT NULL
)
INSERT INTO chat_notices (biz_type_id, task_id, event)
SELECT $1, t.id, t.event FROM unnest($2::uuid[], $3::text[]) AS t(id, event), b WHERE b.chat_url IS NOT NULL

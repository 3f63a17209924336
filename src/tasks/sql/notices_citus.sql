-- The failure and chat notices of the tasks $2 of biz type $1 that the claim on a Citus
-- cluster (claim_citus.sql) ended expired, in its transaction: what claim.sql's `notices`
-- and `chat` CTEs insert on plain PostgreSQL. Only for a biz type that wants them (a
-- failure_url, a chat_url), as there. Locks nothing but the new rows.
WITH b AS (
    SELECT failure_url, chat_url FROM biz_types WHERE id = $1
), notices AS (
    INSERT INTO failure_notices (biz_type_id, task_id, event)
    SELECT $1, t.id, 'task.expired' FROM unnest($2::uuid[]) AS t(id), b WHERE b.failure_url IS NOT NULL
)
INSERT INTO chat_notices (biz_type_id, task_id, event)
SELECT $1, t.id, 'task.expired' FROM unnest($2::uuid[]) AS t(id), b WHERE b.chat_url IS NOT NULL

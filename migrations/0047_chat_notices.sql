-- Notices in a chat tool (src/chat_notices.rs): a biz type may also send its notices to a
-- chat tool's incoming webhook (DingTalk, Feishu/Lark, WeCom or Slack), in that platform's
-- message format and signing. Failed and expired tasks are summarised, at most one message
-- per biz type per few minutes; a receiver going down or up is sent as it happens.
--
-- Expand only: nullable columns and new tables; the previous release neither reads nor
-- writes them (its nodes end tasks without queueing chat notices: a chat tool hears of the
-- tasks that nodes of this release end).
--
-- Locks: a brief ACCESS EXCLUSIVE lock on biz_types for the catalog changes (nullable
-- columns: no rewrite, and the CHECKs hold on every existing row, all NULL, read in one
-- scan of its few rows).

-- The platform, its webhook URL (which for WeCom, DingTalk and Slack holds the robot's key:
-- it is shown to admins only, as the failure_url is), and the signing secret of a DingTalk
-- or Feishu robot that has one, stored as `previous_secret` is (sealed when
-- CHIME_SECRET_KEY is set, in clear otherwise; src/biz_types/secrets.rs).
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS chat_platform text
    CHECK (chat_platform IN ('dingtalk', 'feishu', 'wecom', 'slack'));
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS chat_url text CHECK (chat_url ~ '^https?://');
ALTER TABLE biz_types ADD COLUMN IF NOT EXISTS chat_secret text;
ALTER TABLE biz_types DROP CONSTRAINT IF EXISTS biz_types_chat_check;
ALTER TABLE biz_types ADD CONSTRAINT biz_types_chat_check
    CHECK ((chat_platform IS NULL) = (chat_url IS NULL) AND (chat_secret IS NULL OR chat_platform IN ('dingtalk', 'feishu')));

-- What a biz type's chat tool has yet to hear: a row per task that ended failed or expired,
-- inserted by the statement that ended it (as failure_notices are), and a row per receiver
-- going down or up, inserted by the transaction that moved its breaker (`detail` as in
-- failure_notices). A row is deleted once a message that told of it was delivered, or
-- given up. `taken_by` is the message (`chat_channels.claim`) that tells of it.
CREATE TABLE IF NOT EXISTS chat_notices (
    id          bigserial PRIMARY KEY,
    biz_type_id integer NOT NULL REFERENCES biz_types (id) ON DELETE CASCADE,
    task_id     uuid,
    event       text NOT NULL
        CHECK (event IN ('task.failed', 'task.expired', 'biz_type.receiver_down', 'biz_type.receiver_up')
               AND (task_id IS NOT NULL) = (event LIKE 'task.%')),
    detail      jsonb,
    taken_by    uuid,
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- The sender's probes: a biz type's oldest task row (is a summary due?) and its oldest
-- receiver row (sent as it happens).
CREATE INDEX IF NOT EXISTS chat_notices_tasks_idx ON chat_notices (biz_type_id, created_at) WHERE task_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS chat_notices_receiver_idx ON chat_notices (biz_type_id, id) WHERE task_id IS NULL;
CREATE INDEX IF NOT EXISTS chat_notices_taken_idx ON chat_notices (taken_by) WHERE taken_by IS NOT NULL;

-- A biz type's chat channel, across the cluster: one message at a time (the node holding it
-- sends it, until `held_until`), the retries of the message being sent (`tries`, none
-- before `next_at`), and when the last summary of tasks went (the next one waits the
-- window). Made by the first sender to poll after a biz type is given a chat tool.
CREATE TABLE IF NOT EXISTS chat_channels (
    biz_type_id   integer PRIMARY KEY REFERENCES biz_types (id) ON DELETE CASCADE,
    claim         uuid,
    held_by       uuid,
    held_until    timestamptz,
    tries         integer NOT NULL DEFAULT 0,
    next_at       timestamptz,
    summarised_at timestamptz,
    last_error    text
);

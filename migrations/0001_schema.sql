-- chime's schema. PostgreSQL is the only store; see SPEC §2.
--
-- Index choices, with tens of millions of rows in mind:
--  * `tasks` is range-partitioned by `run_at` (one partition per day by default), so the
--    claim query touches only partitions that can hold due tasks, and retention drops
--    whole partitions instead of running a mass DELETE.
--  * The claim index is partial (`WHERE status = 'pending'`): it holds only the queue,
--    not the finished history, so claiming costs the same with 5 or 50 million finished
--    rows. It leads with biz_type_id because the engine claims per biz type (isolation:
--    a flooded biz type is never in another's way) and asks "when is the next one due?"
--    per biz type.
--  * `tasks_failed_idx` is partial too: failed tasks are few, and the console's "replay the
--    failed tasks matching this filter" must not scan the succeeded ones.
--  * `tasks_list_idx (biz_type_id, run_at, id)` serves the API's keyset-paginated list and
--    time-range filters; other status filters are applied on that walk.
--  * Look-up by id has no run_at, so it probes each partition's primary key index: one
--    cheap probe per partition, which is why partitions are days, not hours.
--  * Idempotency keys must be unique per biz type across all partitions, but a unique index
--    on a partitioned table must include the partition key; keys therefore live in
--    `task_keys`, written in the same statement as the task.

CREATE TABLE biz_types (
    id                 integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name               text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    description        text NOT NULL DEFAULT '',
    callback_url       text NOT NULL DEFAULT '',
    mode               text NOT NULL DEFAULT 'callback' CHECK (mode IN ('callback', 'pull')),
    timeout_ms         integer NOT NULL DEFAULT 10000 CHECK (timeout_ms BETWEEN 1 AND 600000),
    max_attempts       integer NOT NULL DEFAULT 10 CHECK (max_attempts BETWEEN 1 AND 1000),
    backoff_initial_ms integer NOT NULL DEFAULT 1000 CHECK (backoff_initial_ms >= 0),
    backoff_max_ms     integer NOT NULL DEFAULT 3600000 CHECK (backoff_max_ms >= backoff_initial_ms),
    -- callbacks per second across the whole cluster; NULL = unlimited
    rate_limit         double precision CHECK (rate_limit > 0),
    max_in_flight      integer NOT NULL DEFAULT 100 CHECK (max_in_flight >= 1),
    -- API create calls per second; NULL = unlimited
    create_rate_limit  double precision CHECK (create_rate_limit > 0),
    paused             boolean NOT NULL DEFAULT false,
    signing_secret     text NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK (mode = 'pull' OR callback_url ~ '^https?://')
);

-- API tokens are random 32-byte strings, so a SHA-256 of the token is enough to store
-- (no password-style stretching needed) and lets a request be authenticated by one
-- index look-up.
CREATE TABLE api_tokens (
    id           uuid PRIMARY KEY,
    biz_type_id  integer NOT NULL REFERENCES biz_types (id) ON DELETE CASCADE,
    token_hash   bytea NOT NULL UNIQUE,
    -- first characters of the token, to recognise it in lists without revealing it
    prefix       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);
CREATE INDEX api_tokens_biz_type_idx ON api_tokens (biz_type_id);

-- Where the hot partitions end: a task due before `until` lives in `tasks`, one due at or
-- after it in `tasks_cold`. Only the partition manager moves it forward, after the
-- partitions up to the new value exist.
CREATE TABLE hot_horizon (
    single  boolean PRIMARY KEY DEFAULT true CHECK (single),
    until   timestamptz NOT NULL
);
INSERT INTO hot_horizon (until) VALUES (date_trunc('day', now()));

CREATE TABLE tasks (
    id             uuid NOT NULL,
    biz_type_id    integer NOT NULL,
    key            text,
    run_at         timestamptz NOT NULL,
    payload        jsonb NOT NULL DEFAULT 'null',
    status         text NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    -- attempts since the task was created or last replayed (compared with max_attempts)
    attempt_count  integer NOT NULL DEFAULT 0,
    timer_id       uuid,
    last_error     text,
    -- the node holding the task while it is running, and until when
    lease_until    timestamptz,
    leased_by      uuid,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    PRIMARY KEY (id, run_at),
    CHECK ((status = 'running') = (lease_until IS NOT NULL)),
    CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
) PARTITION BY RANGE (run_at);

CREATE INDEX tasks_claim_idx ON tasks (biz_type_id, run_at) WHERE status = 'pending';
CREATE INDEX tasks_lease_idx ON tasks (lease_until) WHERE status = 'running';
CREATE INDEX tasks_failed_idx ON tasks (biz_type_id, run_at) WHERE status = 'failed';
CREATE INDEX tasks_list_idx ON tasks (biz_type_id, run_at, id);

-- Tasks due beyond the hot horizon. Same columns as `tasks`; the migrator moves rows into
-- `tasks` as the horizon advances. Not partitioned: rows only enter and leave it.
CREATE TABLE tasks_cold (LIKE tasks INCLUDING DEFAULTS INCLUDING CONSTRAINTS, PRIMARY KEY (id));
CREATE INDEX tasks_cold_run_at_idx ON tasks_cold (run_at);
CREATE INDEX tasks_cold_list_idx ON tasks_cold (biz_type_id, run_at, id);

-- Every task wherever it lives, for look-ups and lists.
CREATE VIEW all_tasks AS
    SELECT * FROM tasks
    UNION ALL
    SELECT * FROM tasks_cold;

-- Client keys, unique per biz type for as long as the task is retained. `request_hash`
-- is a SHA-256 of the create request as sent, to tell a repeat (200) from a conflict (409).
CREATE TABLE task_keys (
    biz_type_id   integer NOT NULL REFERENCES biz_types (id) ON DELETE CASCADE,
    key           text NOT NULL,
    task_id       uuid NOT NULL,
    request_hash  bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (biz_type_id, key)
);

-- One row per delivery try. Partitioned by start time like `tasks`, so that retention
-- drops old history with whole partitions as well.
CREATE TABLE attempts (
    task_id           uuid NOT NULL,
    number            integer NOT NULL,
    started_at        timestamptz NOT NULL,
    duration_ms       integer NOT NULL,
    status_code       smallint,
    error             text,
    response_excerpt  text,
    node_id           uuid
) PARTITION BY RANGE (started_at);
CREATE INDEX attempts_task_idx ON attempts (task_id, started_at);

CREATE TABLE timers (
    id           uuid PRIMARY KEY,
    biz_type_id  integer NOT NULL REFERENCES biz_types (id) ON DELETE CASCADE,
    key          text NOT NULL,
    cron         text NOT NULL,
    timezone     text NOT NULL DEFAULT 'UTC',
    payload      jsonb NOT NULL DEFAULT 'null',
    active       boolean NOT NULL DEFAULT true,
    catch_up     boolean NOT NULL DEFAULT false,
    -- occurrences up to here have been written as tasks
    materialized_until  timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (biz_type_id, key)
);

CREATE TABLE nodes (
    id            uuid PRIMARY KEY,
    hostname      text NOT NULL,
    pid           integer NOT NULL,
    version       text NOT NULL,
    listen        text NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    id             integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    username       text NOT NULL UNIQUE CHECK (username ~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$'),
    password_hash  text NOT NULL,
    role           text NOT NULL CHECK (role IN ('admin', 'support')),
    disabled       boolean NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE audit_log (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    -- 'user:<name>', 'cli', or 'token:<prefix>'
    actor        text NOT NULL,
    action       text NOT NULL,
    target_type  text NOT NULL,
    target       text NOT NULL,
    before       jsonb,
    after        jsonb
);
CREATE INDEX audit_log_at_idx ON audit_log (at);

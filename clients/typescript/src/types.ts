// The API's shapes, written by hand from the OpenAPI document (GET /api/v1/openapi.json):
// the README says why. Times are RFC 3339 strings in answers; requests take a string or a Date.

export type TaskStatus = "pending" | "running" | "succeeded" | "failed" | "cancelled" | "expired";
export type OnConflict = "reject" | "replace" | "keep";
export type Time = string | Date;

/** A task as the API answers it. */
export interface Task {
  id: string;
  biz_type: string;
  key: string | null;
  run_at: string;
  payload: unknown;
  status: TaskStatus;
  attempt_count: number;
  timer_id: string | null;
  last_error: string | null;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
  expires_at: string | null;
  traceparent: string | null;
  /** 0 to 9, 9 the most urgent. */
  priority: number;
  /** What the task is for inside its biz type (a merchant, a user): the biz type's per-key limits count by it. */
  flow_key: string | null;
}

/** The answer to a create: `created` is true for a 201, false when the key's task answered (200). */
export interface CreatedTask extends Task {
  created: boolean;
}

export interface Attempt {
  number: number;
  started_at: string;
  duration_ms: number;
  status_code: number | null;
  error: string | null;
  response_excerpt: string | null;
  redirected_to?: string | null;
}

export interface TaskWithAttempts extends Task {
  attempts: Attempt[];
}

/** `POST /api/v1/tasks`: give at most one of `run_at` and `delay_ms`, of `expires_at` and `ttl_ms`. */
export interface CreateTask {
  biz_type: string;
  key?: string | null;
  run_at?: Time | null;
  delay_ms?: number | null;
  payload?: unknown;
  on_conflict?: OnConflict;
  expires_at?: Time | null;
  ttl_ms?: number | null;
  /** 0 to 9, 9 the most urgent; 5 when left out or null. */
  priority?: number | null;
  /** What the task is for (a merchant, a user; the rules of `key`): the biz type's `flow_max_in_flight` and `ordered` count by it. */
  flow_key?: string | null;
}

export interface TaskChanges {
  run_at?: Time;
  delay_ms?: number;
  /** Replaces the payload whole; `null` sets it to null. */
  payload?: unknown;
  /** 0 to 9, 9 the most urgent. */
  priority?: number;
}

export interface TaskPage {
  items: Task[];
  next_cursor: string | null;
}

export interface ListFilter {
  status?: TaskStatus;
  /** run_at at or after. */
  from?: Time;
  /** run_at before. */
  to?: Time;
  /** Page size, 1 to 1000. */
  limit?: number;
}

export interface BulkFilter {
  key_prefix?: string;
  run_at_from?: Time;
  run_at_to?: Time;
  timer_id?: string;
  /** Only count the matching tasks, up to 10,000; change nothing. */
  dry_run?: boolean;
  /** Must be true to act on every task of the biz type (a filter without conditions). */
  all?: boolean;
}

export interface BulkCancelled {
  matched: number;
  cancelled: number;
  /** A dry run only: more than `matched` (10,000) match. */
  more?: boolean;
}

export interface BulkReplayed {
  matched: number;
  replayed: number;
  /** A dry run only: more than `matched` (10,000) match. */
  more?: boolean;
}

export interface Timer {
  id: string;
  biz_type: string;
  key: string;
  cron: string;
  timezone: string;
  payload: unknown;
  active: boolean;
  catch_up: boolean;
  materialized_until: string | null;
  created_at: string;
  updated_at: string;
  /** The next (up to 5) fire times; empty while inactive. */
  next_fire_times: string[];
}

export interface CreateTimer {
  biz_type: string;
  key: string;
  /** With a seconds field: `"0 30 2 * * *"`. */
  cron: string;
  timezone?: string;
  payload?: unknown;
  active?: boolean;
  catch_up?: boolean;
}

export interface TimerChanges {
  cron?: string;
  timezone?: string;
  payload?: unknown;
  active?: boolean;
  catch_up?: boolean;
}

/** A task reserved by a pull consumer: settle it with its `receipt`. */
export interface ReservedTask extends Task {
  reserved_until: string;
  receipt: string;
}

export interface ReserveOptions {
  /** Most tasks, 1 to 100 (default 1). */
  max?: number;
  /** Long-poll: how long to wait for a due task, 0 to 30000 (default 0). */
  wait_ms?: number;
  /** How long each stays reserved (default: the biz type's timeout). */
  ttr_ms?: number;
}

export interface Touched {
  id: string;
  reserved_until: string;
}

/** The body of a failure notice POSTed to a biz type's `failure_url` when a task ends failed or expired (`Chime-Event`). */
export interface FailureNotice {
  event: "task.failed" | "task.expired";
  task: Task;
  last_attempt: Attempt | null;
}

/** The body of the notice POSTed to a biz type's `failure_url` when its receiver breaker opens (`receiver_down`) or closes (`receiver_up`). */
export interface ReceiverNotice {
  event: "biz_type.receiver_down" | "biz_type.receiver_up";
  biz_type: string;
  breaker: {
    state: "open" | "closed";
    callback_url: string;
    opened_at: string;
    /** receiver_down: the failure that opened it, how many in a row, and the settings. */
    reason?: string;
    failures?: number;
    window_ms?: number;
    probe_ms?: number;
    /** receiver_up: when it closed, after how many probes, the answering status, and how long it was down. */
    closed_at?: string;
    probes?: number;
    status_code?: number | null;
    down_ms?: number;
  };
}

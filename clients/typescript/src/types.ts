// The API's shapes, under the names this client has always exported. They come from
// `openapi.ts`, generated from the server's OpenAPI document (`chime openapi`, the same
// document as GET /api/v1/openapi.json; clients/test.sh fails when the two drift apart).
// What is written here by hand: requests take a string or a Date for a time, a create's
// answer says whether it created, and the failure notices, which chime sends rather than
// serves, are not in the document.
import type { components, operations } from "./openapi.js";

type Schemas = components["schemas"];
/** `T` with its time fields `K` taking a string or a Date. */
type WithTimes<T, K extends keyof T> = Omit<T, K> & { [P in K]?: Time | null };

export type TaskStatus = Schemas["Status"];
export type OnConflict = Schemas["OnConflict"];
export type Time = string | Date;
/** How a biz type signs its callbacks and failure notices (`signing_scheme`): `verifyWebhook` checks either. */
export type SigningScheme = Schemas["SigningScheme"];

/** A task as the API answers it. */
export type Task = Schemas["Task"];

/** The answer to a create: `created` is true for a 201, false when the key's task answered (200). */
export type CreatedTask = Task & { created: boolean };

export type Attempt = Schemas["Attempt"];

export type TaskWithAttempts = Schemas["TaskWithAttempts"];

/** `POST /api/v1/tasks`: give at most one of `run_at` and `delay_ms`, of `expires_at` and `ttl_ms`. */
export type CreateTask = WithTimes<Schemas["CreateTask"], "run_at" | "expires_at">;

/** `PATCH` of a pending task: `run_at` or `delay_ms`, `payload` (replaced whole), `priority`. */
export type TaskChanges = WithTimes<Schemas["PatchTask"], "run_at">;

export type TaskPage = Schemas["TaskList"];

/** `GET /api/v1/tasks`'s filter (the token's biz type; `from`: run_at at or after, `to`: before). */
export type ListFilter = WithTimes<Omit<NonNullable<operations["listTasks"]["parameters"]["query"]>, "biz_type" | "cursor">, "from" | "to">;

/** Which tasks a bulk cancel or replay acts on; `all: true` for every task of the biz type. */
export type BulkFilter = WithTimes<Schemas["BulkCancel"], "run_at_from" | "run_at_to">;

export type BulkCancelled = Schemas["BulkCancelled"];
export type BulkReplayed = Schemas["BulkReplayed"];

/** A biz type's queue right now (`stats`): counts per state capped at `count_cap`, the oldest due task's age, the last minute's lateness, what is in flight. */
export type BizTypeStats = Schemas["BizTypeStats"];

export type Timer = Schemas["Timer"];
export type CreateTimer = Schemas["CreateTimer"];
/** What to change in a timer. (The document's PatchTimer adds "at least one of them", which
 * openapi-typescript cannot express and makes `unknown`: the fields are a create's.) */
export type TimerChanges = Partial<Pick<CreateTimer, "cron" | "timezone" | "payload" | "active" | "catch_up">>;

/** A task reserved by a pull consumer: settle it with its `receipt`. */
export type ReservedTask = Schemas["ReservedTask"];
export type ReserveOptions = Schemas["ReserveRequest"];
export type Touched = operations["touchTask"]["responses"][200]["content"]["application/json"];

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

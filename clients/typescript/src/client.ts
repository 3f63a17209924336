// The REST API of chime (docs/book/src/api.md) on the platform's fetch.
import { ChimeError, StaleReceiptError, TransportError, UnavailableError, errorFor } from "./errors.js";
import type { components } from "./openapi.js";
import type {
  BizTypeStats, BulkCancelled, BulkFilter, BulkReplayed, CreateTask, CreateTimer, CreatedTask, ListFilter, ReserveOptions,
  ReservedTask, Task, TaskChanges, TaskPage, TaskWithAttempts, Timer, TimerChanges, Touched,
} from "./types.js";

type Schemas = components["schemas"];

export const VERSION = "0.1.0";

export interface ClientOptions {
  /** Per request, in milliseconds (default 30000); a reserve adds its `wait_ms`. */
  timeoutMs?: number;
  /** Tries in all of a keyed create that meets a 503 or no answer (default 3). */
  retries?: number;
  /** First backoff before jitter, in milliseconds (default 200); doubles each try. */
  backoffMs?: number;
  /** Another fetch (a test double, a proxy-aware one); default: the global fetch. */
  fetch?: typeof fetch;
}

/** One item of a batch create: the task (201 or 200), or its error. */
export type BatchResult = { status: 200 | 201; task: Task; error?: undefined } | { status: number; task?: undefined; error: ChimeError };

export interface ConsumerOptions extends ReserveOptions {
  /** Stop after this many tasks. */
  limit?: number;
  /** Stop when this signal aborts (after the tasks in hand are settled). */
  signal?: AbortSignal;
  /** Wait after chime could not be reached, in milliseconds (default 1000). */
  errorPauseMs?: number;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const seg = (value: string) => encodeURIComponent(value);
const byKey = (bizType: string, key: string) => `/api/v1/biz-types/${seg(bizType)}/tasks/by-key/${seg(key)}`;
const time = (value: string | Date | undefined | null) => (value instanceof Date ? value.toISOString() : value);

/** A client of one chime, acting with one biz type's API token. */
export class Client {
  readonly baseUrl: string;
  private readonly token: string;
  private readonly timeoutMs: number;
  private readonly retries: number;
  private readonly backoffMs: number;
  private readonly fetch: typeof fetch;

  constructor(baseUrl: string, token: string, options: ClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.token = token;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.retries = Math.max(1, options.retries ?? 3);
    this.backoffMs = options.backoffMs ?? 200;
    this.fetch = options.fetch ?? globalThis.fetch;
  }

  // --- tasks ----------------------------------------------------------------------------

  /**
   * Schedules a task. With a `key`, a 503 or a lost answer is retried with the same key (the
   * server may have stored it; the repeat answers 200 with that task); without one, never.
   */
  async create(task: CreateTask, options: { traceparent?: string } = {}): Promise<CreatedTask> {
    const headers = options.traceparent ? { traceparent: options.traceparent } : undefined;
    const [status, answer] = await this.withRetries(task.key != null, () => this.send<Task>("POST", "/api/v1/tasks", task, { headers }));
    return { ...answer, created: status === 201 };
  }

  /** Creates up to 1000 tasks; one result per item, in order. Retried like a keyed create when every item has a key. */
  async createBatch(tasks: CreateTask[], options: { traceparent?: string } = {}): Promise<BatchResult[]> {
    const headers = options.traceparent ? { traceparent: options.traceparent } : undefined;
    const keyed = tasks.length > 0 && tasks.every((t) => t.key != null);
    // Whole tasks, not `"results": "ids"`: the answer has no BatchItemId.
    type Item = Schemas["BatchItemCreated"] | Schemas["BatchItemFailed"];
    const [, answer] = await this.withRetries(keyed, () => this.send<{ results: Item[] }>("POST", "/api/v1/tasks/batch", { tasks }, { headers }));
    return answer.results.map((item): BatchResult =>
      "task" in item
        ? { status: item.status as 200 | 201, task: item.task }
        : { status: item.status, error: errorFor(item.status, item.error?.code, item.error?.message ?? "") });
  }

  /** One task with its attempts. */
  get(id: string): Promise<TaskWithAttempts> {
    return this.call("GET", `/api/v1/tasks/${seg(id)}`);
  }

  /** The task holding the key (the newest, if the key changed hands). */
  getByKey(bizType: string, key: string): Promise<Task> {
    return this.call("GET", byKey(bizType, key));
  }

  /** One page of the token's tasks by `run_at`. */
  listPage(filter: ListFilter & { cursor?: string } = {}): Promise<TaskPage> {
    const query = { status: filter.status, from: time(filter.from), to: time(filter.to), limit: filter.limit, cursor: filter.cursor };
    return this.call("GET", "/api/v1/tasks", undefined, query);
  }

  /** Every matching task, page after page, fetched as the iteration reaches them (`for await`). */
  async *list(filter: ListFilter = {}): AsyncGenerator<Task, void, undefined> {
    let cursor: string | undefined;
    do {
      const page = await this.listPage({ ...filter, cursor });
      yield* page.items;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }

  /** Moves a pending task, replaces its payload and/or changes its priority. */
  reschedule(id: string, changes: TaskChanges): Promise<Task> {
    return this.call("PATCH", `/api/v1/tasks/${seg(id)}`, changes);
  }

  rescheduleByKey(bizType: string, key: string, changes: TaskChanges): Promise<Task> {
    return this.call("PATCH", byKey(bizType, key), changes);
  }

  /** Cancels a pending task; answers it, `cancelled`. */
  cancel(id: string): Promise<Task> {
    return this.call("DELETE", `/api/v1/tasks/${seg(id)}`);
  }

  cancelByKey(bizType: string, key: string): Promise<Task> {
    return this.call("DELETE", byKey(bizType, key));
  }

  /** A failed, expired, succeeded or cancelled task back to pending, due now. */
  replay(id: string): Promise<Task> {
    return this.call("POST", `/api/v1/tasks/${seg(id)}/replay`);
  }

  /** Bulk cancel of the pending tasks matching. */
  cancelMatching(bizType: string, filter: BulkFilter): Promise<BulkCancelled> {
    return this.call("POST", `/api/v1/biz-types/${seg(bizType)}/tasks/cancel`, filter);
  }

  /** Bulk replay of the failed or expired tasks matching. */
  replayMatching(bizType: string, filter: BulkFilter & { status: "failed" | "expired" }): Promise<BulkReplayed> {
    return this.call("POST", `/api/v1/biz-types/${seg(bizType)}/tasks/replay`, filter);
  }

  /**
   * The biz type's queue right now, whole cluster: counts per state (each exact below
   * `count_cap`, 10,000, and named in `capped` when it reached it), the oldest due task's
   * age, the last minute's lateness, what is in flight. Cheap enough to poll every second.
   */
  stats(bizType: string): Promise<BizTypeStats> {
    return this.call("GET", `/api/v1/biz-types/${seg(bizType)}/stats`);
  }

  // --- timers ---------------------------------------------------------------------------

  createTimer(timer: CreateTimer): Promise<Timer> {
    return this.call("POST", "/api/v1/timers", timer);
  }

  getTimer(id: string): Promise<Timer> {
    return this.call("GET", `/api/v1/timers/${seg(id)}`);
  }

  /** Every timer of the token's biz type, by key. */
  async *listTimers(options: { limit?: number } = {}): AsyncGenerator<Timer, void, undefined> {
    let cursor: string | undefined;
    do {
      const page = await this.call<Schemas["TimerList"]>("GET", "/api/v1/timers", undefined, { limit: options.limit, cursor });
      yield* page.items;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }

  updateTimer(id: string, changes: TimerChanges): Promise<Timer> {
    return this.call("PATCH", `/api/v1/timers/${seg(id)}`, changes);
  }

  activateTimer(id: string): Promise<Timer> {
    return this.call("POST", `/api/v1/timers/${seg(id)}/activate`);
  }

  deactivateTimer(id: string): Promise<Timer> {
    return this.call("POST", `/api/v1/timers/${seg(id)}/deactivate`);
  }

  async deleteTimer(id: string): Promise<void> {
    await this.call("DELETE", `/api/v1/timers/${seg(id)}`);
  }

  // --- pull -----------------------------------------------------------------------------

  /** Reserves up to `max` due tasks of a pull biz type, waiting up to `wait_ms` for one. */
  async reserve(bizType: string, options: ReserveOptions = {}): Promise<ReservedTask[]> {
    // The answer may take wait_ms to come: the request must be allowed longer than that.
    const timeoutMs = this.timeoutMs + (options.wait_ms ?? 0);
    const answer = await this.call<Schemas["Reserved"]>("POST", `/api/v1/biz-types/${seg(bizType)}/reserve`, options, undefined, timeoutMs);
    return answer.tasks;
  }

  ack(id: string, receipt: string): Promise<Task> {
    return this.call("POST", `/api/v1/tasks/${seg(id)}/ack`, { receipt });
  }

  nack(id: string, receipt: string, options: { delay_ms?: number; error?: string } = {}): Promise<Task> {
    const error = options.error === undefined ? undefined : [...options.error].slice(0, 1000).join("");
    return this.call("POST", `/api/v1/tasks/${seg(id)}/nack`, { receipt, ...options, error });
  }

  touch(id: string, receipt: string, ttrMs?: number): Promise<Touched> {
    return this.call("POST", `/api/v1/tasks/${seg(id)}/touch`, { receipt, ttr_ms: ttrMs });
  }

  /**
   * Reserves a pull biz type's tasks and hands each to `handler`: a resolved promise acks
   * it, a rejected one nacks it (its message as the task's error; retried after the biz
   * type's backoff). A receipt that went stale meanwhile (the handler outlived `ttr_ms`) is
   * dropped: the task is another reservation's now.
   *
   * Runs until `signal` aborts or, with `limit`, until that many tasks were handled;
   * resolves to how many were. Stopping is clean: the tasks already reserved are handled,
   * no new ones are reserved; a waiting reserve ends within `wait_ms`.
   */
  async consume(bizType: string, handler: (task: ReservedTask) => unknown, options: ConsumerOptions = {}): Promise<number> {
    const { limit, signal, errorPauseMs = 1000, ttr_ms } = options;
    const max = options.max ?? 10, wait_ms = options.wait_ms ?? 20_000;
    let handled = 0;
    while (!signal?.aborted && (limit === undefined || handled < limit)) {
      let tasks: ReservedTask[];
      try {
        tasks = await this.reserve(bizType, { max: limit === undefined ? max : Math.min(max, limit - handled), wait_ms, ttr_ms });
      } catch (e) {
        if (!(e instanceof TransportError || e instanceof UnavailableError)) throw e;
        // chime restarting or unreachable: try again shortly.
        await sleep(errorPauseMs);
        continue;
      }
      for (const task of tasks) {
        let failure: string | null = null;
        try {
          await handler(task);
        } catch (e) {
          failure = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
        }
        try {
          if (failure === null) await this.ack(task.id, task.receipt);
          else await this.nack(task.id, task.receipt, { error: failure });
        } catch (e) {
          // Unsettled, the task comes back when its reservation ends (at least once).
          if (!(e instanceof StaleReceiptError || e instanceof TransportError || e instanceof UnavailableError)) throw e;
        }
        handled++;
      }
    }
    return handled;
  }

  // --- transport ------------------------------------------------------------------------

  /** One call: the answer's JSON (undefined for 204), or rejects with the ChimeError it amounts to. */
  async call<T>(method: string, path: string, body?: unknown, query?: Record<string, string | number | undefined | null>, timeoutMs?: number): Promise<T> {
    return (await this.send<T>(method, path, body, { query, timeoutMs }))[1];
  }

  private async send<T>(
    method: string,
    path: string,
    body: unknown,
    options: { headers?: Record<string, string>; query?: Record<string, string | number | undefined | null>; timeoutMs?: number } = {},
  ): Promise<[number, T]> {
    let url = this.baseUrl + path;
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(options.query ?? {})) {
      if (value !== undefined && value !== null) params.set(name, String(value));
    }
    if ([...params].length > 0) url += `?${params}`;
    const headers: Record<string, string> = {
      authorization: `Bearer ${this.token}`,
      accept: "application/json",
      "user-agent": `chime-client-typescript/${VERSION}`,
      ...options.headers,
    };
    if (body !== undefined) headers["content-type"] = "application/json";
    let answer: Response;
    let text: string;
    try {
      answer = await this.fetch(url, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(options.timeoutMs ?? this.timeoutMs),
      });
      text = await answer.text();
    } catch (e) {
      const cause = e instanceof Error ? ((e.cause as Error | undefined)?.message ?? e.message) : String(e);
      throw new TransportError(`${method} ${path}: no answer from chime: ${cause}`, 0, null, null, { cause: e });
    }
    if (answer.status >= 400) {
      let code: string | undefined;
      let message: string | undefined;
      try {
        const error = JSON.parse(text).error;
        code = error?.code;
        message = error?.message;
      } catch {
        // Not chime's JSON (a proxy's page): typed by its status.
      }
      const retryAfter = answer.headers.get("retry-after");
      throw errorFor(answer.status, code, message ?? (text.slice(0, 200) || `HTTP ${answer.status}`), retryAfter ? Number(retryAfter) : null);
    }
    return [answer.status, (text === "" ? undefined : JSON.parse(text)) as T];
  }

  private async withRetries<T>(retry: boolean, call: () => Promise<T>): Promise<T> {
    const tries = retry ? this.retries : 1;
    for (let attempt = 1; ; attempt++) {
      try {
        return await call();
      } catch (e) {
        if (!(e instanceof TransportError || e instanceof UnavailableError) || attempt >= tries) throw e;
        // Exponential backoff with full jitter, at least what a Retry-After asked.
        const wait = Math.random() * this.backoffMs * 2 ** (attempt - 1);
        await sleep(Math.max(wait, (e.retryAfter ?? 0) * 1000));
      }
    }
  }
}

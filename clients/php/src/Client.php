<?php

declare(strict_types=1);

namespace Chime;

/**
 * A client of one chime, acting with one biz type's API token (docs/book/src/api.md).
 *
 * Requests and answers are arrays with the API's field names; JSON objects come back as
 * associative arrays (a payload too). Send an empty object as `new \stdClass()`: PHP's `[]`
 * is sent as an empty JSON array.
 *
 * Options: `timeout` (seconds, default 30), `retries` (tries in all of a keyed create on a 503
 * or a lost answer, default 3), `backoff` (seconds, first backoff before jitter, default 0.2).
 */
final class Client
{
    public const VERSION = '0.1.0';

    private string $baseUrl;
    private float $timeout;
    private int $retries;
    private float $backoff;
    /** @var \CurlHandle|null one handle, so that connections are kept alive between calls */
    private $curl = null;

    /** @param array{timeout?: float, retries?: int, backoff?: float} $options */
    public function __construct(string $baseUrl, private string $token, array $options = [])
    {
        $this->baseUrl = rtrim($baseUrl, '/');
        $this->timeout = (float) ($options['timeout'] ?? 30);
        $this->retries = max(1, (int) ($options['retries'] ?? 3));
        $this->backoff = (float) ($options['backoff'] ?? 0.2);
    }

    // --- tasks ------------------------------------------------------------------------

    /**
     * Schedules a task: `biz_type`, and any of `key`, `run_at` | `delay_ms`, `payload`,
     * `on_conflict` (`reject`, `replace`, `keep`), `expires_at` | `ttl_ms`, `priority` (0 to
     * 9, 9 the most urgent; 5 when left out), `flow_key` (what it is for: a merchant, a user;
     * the biz type's per-key limits count by it). Answers the task, with `created` added: true for
     * a 201, false when the key's task answered (200). With a `key`, a 503 or a lost answer is
     * retried with the same key (the server may have stored it); without one, never.
     *
     * @param array<string, mixed> $fields
     * @return array<string, mixed>
     */
    public function create(array $fields, ?string $traceparent = null): array
    {
        $headers = $traceparent !== null ? ['traceparent: ' . $traceparent] : [];
        [$status, $task] = $this->withRetries(isset($fields['key']), fn () => $this->send('POST', '/api/v1/tasks', $fields, $headers));
        $task['created'] = $status === 201;
        return $task;
    }

    /**
     * Creates up to 1000 tasks (each an array as for create()). One result per item, in
     * order: `['status' => 201|200, 'task' => [...]]` or `['status' => 4xx, 'error' => ApiException]`.
     * Retried like a keyed create when every item has a key.
     *
     * @param list<array<string, mixed>> $items
     * @return list<array{status: int, task?: array<string, mixed>, error?: ApiException}>
     */
    public function createBatch(array $items, ?string $traceparent = null): array
    {
        $headers = $traceparent !== null ? ['traceparent: ' . $traceparent] : [];
        $keyed = $items !== [] && count(array_filter($items, fn ($item) => isset($item['key']))) === count($items);
        [, $answer] = $this->withRetries($keyed, fn () => $this->send('POST', '/api/v1/tasks/batch', ['tasks' => $items], $headers));
        $results = [];
        foreach ($answer['results'] as $item) {
            if (isset($item['task'])) {
                $results[] = ['status' => $item['status'], 'task' => $item['task']];
            } else {
                $error = $item['error'] ?? [];
                $results[] = ['status' => $item['status'], 'error' => ApiException::fromAnswer($item['status'], $error['code'] ?? null, $error['message'] ?? '')];
            }
        }
        return $results;
    }

    /** One task with its `attempts`. */
    public function get(string $id): array
    {
        return $this->call('GET', '/api/v1/tasks/' . rawurlencode($id));
    }

    /** The task holding the key (the newest, if the key changed hands). */
    public function getByKey(string $bizType, string $key): array
    {
        return $this->call('GET', self::byKey($bizType, $key));
    }

    /**
     * One page of the token's tasks by `run_at`: `['items' => [...], 'next_cursor' => ?string]`.
     *
     * @param array{status?: string, from?: string, to?: string, limit?: int, cursor?: string} $query
     */
    public function listPage(array $query = []): array
    {
        return $this->call('GET', '/api/v1/tasks', null, $query);
    }

    /**
     * Every matching task, page after page, fetched as the iteration reaches them.
     *
     * @param array{status?: string, from?: string, to?: string, limit?: int} $query `limit` is the page size
     * @return \Generator<int, array<string, mixed>>
     */
    public function list(array $query = []): \Generator
    {
        unset($query['cursor']);
        do {
            $page = $this->listPage($query);
            yield from $page['items'];
            $query['cursor'] = $page['next_cursor'];
        } while ($page['next_cursor'] !== null);
    }

    /** Moves a pending task (`run_at` or `delay_ms`), replaces its `payload` (null included) and/or changes its `priority`. */
    public function reschedule(string $id, array $changes): array
    {
        return $this->call('PATCH', '/api/v1/tasks/' . rawurlencode($id), $changes);
    }

    public function rescheduleByKey(string $bizType, string $key, array $changes): array
    {
        return $this->call('PATCH', self::byKey($bizType, $key), $changes);
    }

    /** Cancels a pending task; answers it, `cancelled`. */
    public function cancel(string $id): array
    {
        return $this->call('DELETE', '/api/v1/tasks/' . rawurlencode($id));
    }

    public function cancelByKey(string $bizType, string $key): array
    {
        return $this->call('DELETE', self::byKey($bizType, $key));
    }

    /** A failed, expired, succeeded or cancelled task back to pending, due now. */
    public function replay(string $id): array
    {
        return $this->call('POST', '/api/v1/tasks/' . rawurlencode($id) . '/replay');
    }

    /** Bulk cancel of pending tasks matching `key_prefix`, `run_at_from`, `run_at_to`, `timer_id` (or `all` => true); `dry_run` only counts, up to 10,000 → `matched`, `cancelled`, `more`. */
    public function cancelMatching(string $bizType, array $filter): array
    {
        return $this->call('POST', '/api/v1/biz-types/' . rawurlencode($bizType) . '/tasks/cancel', (object) $filter);
    }

    /** Bulk replay: `status` (`failed` or `expired`) and the filter of cancelMatching() → `matched`, `replayed`. */
    public function replayMatching(string $bizType, array $filter): array
    {
        return $this->call('POST', '/api/v1/biz-types/' . rawurlencode($bizType) . '/tasks/replay', (object) $filter);
    }

    /**
     * The biz type's queue right now, whole cluster: `counts` per state (`due`, `pending`, `running`, `retrying`, `failed`,
     * `expired`; each exact below `count_cap`, 10,000, and named in `capped` when it reached it), `oldest_due_age_ms`, the
     * last minute's `lateness` (`p50_ms`, `p99_ms`) and `in_flight` against `max_in_flight`. Cheap enough to poll every second.
     */
    public function stats(string $bizType): array
    {
        return $this->call('GET', '/api/v1/biz-types/' . rawurlencode($bizType) . '/stats');
    }

    // --- timers -----------------------------------------------------------------------

    /** `biz_type`, `key`, `cron` (with a seconds field), and any of `timezone`, `payload`, `active`, `catch_up`. */
    public function createTimer(array $fields): array
    {
        return $this->call('POST', '/api/v1/timers', $fields);
    }

    /** A timer with its `next_fire_times`. */
    public function getTimer(string $id): array
    {
        return $this->call('GET', '/api/v1/timers/' . rawurlencode($id));
    }

    /** @return \Generator<int, array<string, mixed>> every timer of the token's biz type, by key */
    public function listTimers(?int $pageSize = null): \Generator
    {
        $query = ['limit' => $pageSize];
        do {
            $page = $this->call('GET', '/api/v1/timers', null, $query);
            yield from $page['items'];
            $query['cursor'] = $page['next_cursor'];
        } while ($page['next_cursor'] !== null);
    }

    /** Changes any of `cron`, `timezone`, `payload`, `active`, `catch_up`. */
    public function updateTimer(string $id, array $changes): array
    {
        return $this->call('PATCH', '/api/v1/timers/' . rawurlencode($id), (object) $changes);
    }

    public function activateTimer(string $id): array
    {
        return $this->call('POST', '/api/v1/timers/' . rawurlencode($id) . '/activate');
    }

    public function deactivateTimer(string $id): array
    {
        return $this->call('POST', '/api/v1/timers/' . rawurlencode($id) . '/deactivate');
    }

    public function deleteTimer(string $id): void
    {
        $this->call('DELETE', '/api/v1/timers/' . rawurlencode($id));
    }

    // --- pull -------------------------------------------------------------------------

    /**
     * Reserves up to `max` due tasks of a pull biz type, waiting up to `wait_ms` (at most
     * 30000) for one; each comes with its `receipt` and `reserved_until`.
     *
     * @param array{max?: int, wait_ms?: int, ttr_ms?: int} $options
     * @return list<array<string, mixed>>
     */
    public function reserve(string $bizType, array $options = []): array
    {
        $wait = (int) ($options['wait_ms'] ?? 0);
        // The answer may take wait_ms to come: the transfer must be allowed longer than that.
        $answer = $this->call('POST', '/api/v1/biz-types/' . rawurlencode($bizType) . '/reserve', (object) $options, [], $this->timeout + $wait / 1000);
        return $answer['tasks'];
    }

    public function ack(string $id, string $receipt): array
    {
        return $this->call('POST', '/api/v1/tasks/' . rawurlencode($id) . '/ack', ['receipt' => $receipt]);
    }

    /** @param array{delay_ms?: int, error?: string} $options */
    public function nack(string $id, string $receipt, array $options = []): array
    {
        if (isset($options['error'])) {
            // At most 1000 characters (not bytes), without needing mbstring.
            preg_match('/^.{0,1000}/su', $options['error'], $m);
            $options['error'] = $m[0] ?? substr($options['error'], 0, 1000);
        }
        return $this->call('POST', '/api/v1/tasks/' . rawurlencode($id) . '/nack', ['receipt' => $receipt] + $options);
    }

    /** Extends a reservation to `ttr_ms` from now; answers `id` and `reserved_until`. */
    public function touch(string $id, string $receipt, ?int $ttrMs = null): array
    {
        $body = ['receipt' => $receipt];
        if ($ttrMs !== null) {
            $body['ttr_ms'] = $ttrMs;
        }
        return $this->call('POST', '/api/v1/tasks/' . rawurlencode($id) . '/touch', $body);
    }

    /**
     * A Consumer of this pull biz type's tasks (see Consumer).
     *
     * @param callable(array<string, mixed>): mixed $handler
     */
    public function consumer(string $bizType, callable $handler, array $options = []): Consumer
    {
        return new Consumer($this, $bizType, $handler, $options);
    }

    // --- transport --------------------------------------------------------------------

    /**
     * One call: the answer's JSON as arrays (null for 204), or throws the ApiException it
     * amounts to.
     *
     * @param array<string, mixed>|object|null $body
     * @param array<string, mixed> $query
     */
    public function call(string $method, string $path, array|object|null $body = null, array $query = [], ?float $timeout = null): mixed
    {
        return $this->send($method, $path, $body, [], $query, $timeout)[1];
    }

    /** @return array{int, mixed} the status and the decoded answer */
    private function send(string $method, string $path, array|object|null $body, array $headers = [], array $query = [], ?float $timeout = null): array
    {
        $url = $this->baseUrl . $path;
        $query = array_filter($query, fn ($v) => $v !== null);
        if ($query !== []) {
            $url .= '?' . http_build_query($query, '', '&', PHP_QUERY_RFC3986);
        }
        $headers[] = 'Authorization: Bearer ' . $this->token;
        $headers[] = 'Accept: application/json';
        $headers[] = 'Expect:';
        $this->curl ??= curl_init();
        $curl = $this->curl;
        curl_reset($curl);
        $retryAfter = null;
        $options = [
            CURLOPT_URL => $url,
            CURLOPT_CUSTOMREQUEST => $method,
            CURLOPT_RETURNTRANSFER => true,
            CURLOPT_TIMEOUT_MS => (int) (($timeout ?? $this->timeout) * 1000),
            CURLOPT_CONNECTTIMEOUT_MS => (int) (min($timeout ?? $this->timeout, 10) * 1000),
            CURLOPT_USERAGENT => 'chime-client-php/' . self::VERSION,
            CURLOPT_HEADERFUNCTION => function ($curl, string $line) use (&$retryAfter): int {
                if (stripos($line, 'Retry-After:') === 0) {
                    $retryAfter = (float) trim(substr($line, 12));
                }
                return strlen($line);
            },
        ];
        if ($body !== null) {
            $options[CURLOPT_POSTFIELDS] = json_encode($body, JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE | JSON_PRESERVE_ZERO_FRACTION | JSON_THROW_ON_ERROR);
            $headers[] = 'Content-Type: application/json';
        }
        $options[CURLOPT_HTTPHEADER] = $headers;
        curl_setopt_array($curl, $options);
        $raw = curl_exec($curl);
        if ($raw === false) {
            throw new TransportException(sprintf('%s %s: no answer from chime: %s', $method, $path, curl_error($curl)));
        }
        $status = (int) curl_getinfo($curl, CURLINFO_RESPONSE_CODE);
        $decoded = $raw === '' ? null : json_decode($raw, true);
        if ($status >= 400) {
            $error = is_array($decoded) && is_array($decoded['error'] ?? null) ? $decoded['error'] : [];
            $message = $error['message'] ?? (substr($raw, 0, 200) ?: "HTTP $status");
            throw ApiException::fromAnswer($status, $error['code'] ?? null, $message, $retryAfter);
        }
        return [$status, $decoded];
    }

    private function withRetries(bool $retry, callable $call): mixed
    {
        $tries = $retry ? $this->retries : 1;
        for ($attempt = 1; ; $attempt++) {
            try {
                return $call();
            } catch (TransportException | UnavailableException $e) {
                if ($attempt >= $tries) {
                    throw $e;
                }
                // Exponential backoff with full jitter, at least what a Retry-After asked.
                $wait = $this->backoff * (2 ** ($attempt - 1)) * (mt_rand() / mt_getrandmax());
                usleep((int) (max($wait, $e->getRetryAfter() ?? 0) * 1e6));
            }
        }
    }

    private static function byKey(string $bizType, string $key): string
    {
        return '/api/v1/biz-types/' . rawurlencode($bizType) . '/tasks/by-key/' . rawurlencode($key);
    }
}

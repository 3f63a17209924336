<?php

declare(strict_types=1);

namespace Chime;

/**
 * Reserves a pull biz type's tasks and hands each to the handler: a return acks it, an
 * exception nacks it (its message as the task's error; retried after the biz type's
 * backoff). A receipt that went stale meanwhile (the handler outlived `ttr_ms`) is dropped:
 * the task is another reservation's now.
 *
 * run() loops until stop() is called (from the handler, or a signal handler with
 * `pcntl_async_signals(true)`) or, with `limit`, until that many tasks were handled.
 * Stopping is clean: the tasks already reserved are handled, no new ones are reserved; a
 * waiting reserve ends within `wait_ms`.
 *
 * Options: `max` (tasks per reserve, default 10), `wait_ms` (long-poll, default 20000),
 * `ttr_ms` (default: the biz type's timeout), `limit` (stop after this many tasks),
 * `error_pause` (seconds to wait after chime could not be reached, default 1).
 */
final class Consumer
{
    private bool $stopped = false;
    private int $handled = 0;
    /** @var callable */
    private $handler;

    public function __construct(private Client $client, private string $bizType, callable $handler, private array $options = [])
    {
        $this->handler = $handler;
    }

    public function stop(): void
    {
        $this->stopped = true;
    }

    public function isStopped(): bool
    {
        return $this->stopped;
    }

    /** Runs until stopped; answers how many tasks were handled. */
    public function run(): int
    {
        $max = (int) ($this->options['max'] ?? 10);
        $limit = $this->options['limit'] ?? null;
        $reserve = ['wait_ms' => (int) ($this->options['wait_ms'] ?? 20000)];
        if (isset($this->options['ttr_ms'])) {
            $reserve['ttr_ms'] = (int) $this->options['ttr_ms'];
        }
        while (!$this->stopped && ($limit === null || $this->handled < $limit)) {
            $reserve['max'] = $limit === null ? $max : min($max, $limit - $this->handled);
            try {
                $tasks = $this->client->reserve($this->bizType, $reserve);
            } catch (TransportException | UnavailableException) {
                // chime restarting or unreachable: try again shortly.
                usleep((int) (($this->options['error_pause'] ?? 1.0) * 1e6));
                continue;
            }
            foreach ($tasks as $task) {
                $this->handle($task);
            }
        }
        return $this->handled;
    }

    private function handle(array $task): void
    {
        $failure = null;
        try {
            ($this->handler)($task);
        } catch (\Throwable $e) {
            $failure = get_class($e) . ': ' . $e->getMessage();
        }
        try {
            if ($failure === null) {
                $this->client->ack($task['id'], $task['receipt']);
            } else {
                $this->client->nack($task['id'], $task['receipt'], ['error' => $failure]);
            }
        } catch (StaleReceiptException | TransportException | UnavailableException) {
            // Unsettled, the task comes back when its reservation ends (at least once).
        }
        $this->handled++;
    }
}

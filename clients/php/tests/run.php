<?php
// The PHP client's suite, plain PHP: `php clients/php/tests/run.php`, against the chime
// that clients/test.sh starts (CHIME_TEST_URL, CHIME_TEST_ADMIN_TOKEN), with a real receiver
// (`php -S` running tests/receiver.php) and a connection-dropping proxy (tests/proxy.php).
// Exits 1 if any test fails.

declare(strict_types=1);

require __DIR__ . '/../autoload.php';

use Chime\Client;
use Chime\InvalidArgumentException;
use Chime\InvalidStateException;
use Chime\KeyConflictException;
use Chime\NotFoundException;
use Chime\PermissionDeniedException;
use Chime\Signature;
use Chime\StaleReceiptException;
use Chime\TransportException;
use Chime\UnauthenticatedException;
use Chime\UnavailableException;

final class Failed extends Exception {}

function check(bool $ok, string $what): void
{
    if (!$ok) {
        throw new Failed($what);
    }
}

function same(mixed $expected, mixed $actual, string $what = ''): void
{
    if ($expected !== $actual) {
        throw new Failed(sprintf("%s\n    expected %s\n    got      %s", $what, var_export($expected, true), var_export($actual, true)));
    }
}

/** Runs $call, which must throw $class; answers the exception. */
function throws(string $class, callable $call): Throwable
{
    try {
        $call();
    } catch (Throwable $e) {
        if ($e instanceof $class) {
            return $e;
        }
        throw new Failed(sprintf('expected %s, got %s: %s', $class, get_class($e), $e->getMessage()));
    }
    throw new Failed("expected $class, nothing was thrown");
}

function waitFor(string $what, callable $check, float $seconds = 15.0): mixed
{
    $deadline = microtime(true) + $seconds;
    while (microtime(true) < $deadline) {
        if ($value = $check()) {
            return $value;
        }
        usleep(50_000);
    }
    throw new Failed("$what: not within $seconds s");
}

function uuid(): string
{
    $b = random_bytes(16);
    $b[6] = chr(ord($b[6]) & 0x0f | 0x40);
    $b[8] = chr(ord($b[8]) & 0x3f | 0x80);
    return vsprintf('%s%s-%s-%s-%s-%s%s%s', str_split(bin2hex($b), 4));
}

$url = getenv('CHIME_TEST_URL') ?: '';
$adminToken = getenv('CHIME_TEST_ADMIN_TOKEN') ?: '';
$run = bin2hex(random_bytes(3));

// --- the signature vectors need no chime ---------------------------------------------------

$tests = [];
$tests['signature vectors'] = function () {
    $vectors = json_decode(file_get_contents(__DIR__ . '/../../signature-vectors.json'), true, 512, JSON_THROW_ON_ERROR);
    check(count($vectors['verify']) > 20, 'the vectors are there');
    foreach ($vectors['verify'] as $case) {
        same($case['expected'], Signature::verify($case['body'], $case['header'], $case['secrets'], $case['tolerance'], $case['now']), $case['name']);
    }
    foreach ($vectors['signatures'] as $v) {
        check(Signature::verify($v['body'], $v['header'], [$v['secret']], 300, $v['t']), $v['name']);
    }
    check(!Signature::verify('{}', null, ['s']), 'a missing header');
};
$tests['standard webhooks vectors'] = function () {
    $vectors = json_decode(file_get_contents(__DIR__ . '/../../signature-vectors.json'), true, 512, JSON_THROW_ON_ERROR)['standard_webhooks'];
    check(count($vectors['verify']) > 20, 'the vectors are there');
    foreach ($vectors['verify'] as $case) {
        same($case['expected'], Signature::verifyWebhook($case['body'], $case['headers'], $case['secrets'], $case['tolerance'], $case['now']), $case['name']);
    }
    foreach ($vectors['signatures'] as $v) {
        $headers = ['webhook-id' => $v['id'], 'webhook-timestamp' => (string) $v['t'], 'webhook-signature' => $v['signature']];
        check(Signature::verifyWebhook($v['body'], $headers, $v['secret'], 300, $v['t']), $v['name']);
    }
    check(!Signature::verifyWebhook('{}', ['webhook-signature' => 'v1,x', 'webhook-id' => 'm', 'webhook-timestamp' => '1'], ['', 's'], 300, 1), 'no whsec_ secret');
};

if ($url === '' || $adminToken === '') {
    fwrite(STDERR, "CHIME_TEST_URL and CHIME_TEST_ADMIN_TOKEN are not set: run the suite with clients/test.sh php\n");
    exit(1);
}

function admin(string $method, string $path, ?array $body = null): array
{
    global $url, $adminToken;
    $curl = curl_init($url . $path);
    curl_setopt_array($curl, [CURLOPT_CUSTOMREQUEST => $method, CURLOPT_RETURNTRANSFER => true,
        CURLOPT_HTTPHEADER => ["Authorization: Bearer $adminToken", 'Content-Type: application/json']]);
    if ($body !== null) {
        curl_setopt($curl, CURLOPT_POSTFIELDS, json_encode($body));
    }
    $answer = curl_exec($curl);
    $status = curl_getinfo($curl, CURLINFO_RESPONSE_CODE);
    if ($status >= 300) {
        throw new RuntimeException("admin $method $path: $status $answer");
    }
    return json_decode($answer, true);
}

/** A fresh biz type: its name, signing secret and an API token. */
function biz(string $purpose, array $settings): array
{
    global $run;
    $name = "php-$run-$purpose";
    $created = admin('POST', '/api/v1/admin/biz-types', ['name' => $name] + $settings);
    $token = admin('POST', "/api/v1/admin/biz-types/$name/tokens")['token'];
    return ['name' => $name, 'secret' => $created['signing_secret'], 'token' => $token];
}

function freePort(): int
{
    $s = stream_socket_server('tcp://127.0.0.1:0');
    $name = stream_socket_get_name($s, false);
    fclose($s);
    return (int) substr($name, strrpos($name, ':') + 1);
}

// The receiver: PHP's built-in web server, writing each callback to a file.
$calls = sys_get_temp_dir() . '/chime-php-calls-' . $run;
mkdir($calls);
$receiverPort = freePort();
$receiver = proc_open(
    [PHP_BINARY, '-S', "127.0.0.1:$receiverPort", __DIR__ . '/receiver.php'],
    [0 => ['file', '/dev/null', 'r'], 1 => ['file', '/dev/null', 'w'], 2 => ['file', '/dev/null', 'w']],
    $pipes,
    null,
    ['CHIME_RECEIVER_DIR' => $calls] + getenv(),
);
register_shutdown_function(function () use ($receiver, $calls) {
    proc_terminate($receiver);
    array_map('unlink', glob("$calls/*"));
    rmdir($calls);
});
waitFor('the receiver listens', fn () => @fsockopen('127.0.0.1', $receiverPort) !== false, 10);
$receiverUrl = "http://127.0.0.1:$receiverPort/hook";

$hooks = biz('hooks', ['callback_url' => $receiverUrl, 'timeout_ms' => 5000, 'backoff_initial_ms' => 100, 'backoff_max_ms' => 1000]);
$pull = biz('pull', ['mode' => 'pull', 'timeout_ms' => 30000, 'backoff_initial_ms' => 100, 'backoff_max_ms' => 1000]);
$other = biz('other', ['callback_url' => $receiverUrl]);

/** Starts tests/proxy.php in front of chime; answers [url, process, stdout]. */
function proxy(string $mode = 'drop'): array
{
    global $url;
    $process = proc_open([PHP_BINARY, __DIR__ . '/proxy.php', substr($url, strlen('http://')), $mode], [0 => ['file', '/dev/null', 'r'], 1 => ['pipe', 'w'], 2 => ['file', '/dev/null', 'w']], $pipes);
    $port = (int) trim(fgets($pipes[1]));
    return ["http://127.0.0.1:$port", $process, $pipes[1]];
}

$tests['create, callback received, signature verified'] = function () use ($url, $hooks, $other, $calls) {
    $client = new Client($url, $hooks['token']);
    $key = 'order-' . uuid();
    $task = $client->create(['biz_type' => $hooks['name'], 'key' => $key, 'payload' => ['order' => 123, 'name' => 'Zoë']]);
    same(['pending', $key, true], [$task['status'], $task['key'], $task['created']]);
    // A JSON object's keys come back in the database's order (jsonb): compared as a map.
    check($task['payload'] == ['order' => 123, 'name' => 'Zoë'], 'the payload');
    $call = waitFor('the callback', function () use ($calls, $task) {
        foreach (glob("$calls/*.json") as $file) {
            $call = json_decode(file_get_contents($file), true);
            if ($call['task_id'] === $task['id']) {
                return $call;
            }
        }
        return null;
    });
    $body = base64_decode($call['body']);
    check(Signature::verify($body, $call['signature'], $hooks['secret']), 'the signature verifies');
    check(Signature::verify($body, $call['signature'], ['whsec_old_one_000000000', $hooks['secret']]), 'with the secret second of two');
    check(!Signature::verify($body, $call['signature'], $other['secret']), "another biz type's secret");
    check(!Signature::verify($body . ' ', $call['signature'], $hooks['secret']), 'a changed body');
    check(json_decode($body, true)['payload'] == ['order' => 123, 'name' => 'Zoë'], 'the payload in the callback');
    $done = waitFor('succeeded', fn () => ($t = $client->get($task['id']))['status'] === 'succeeded' ? $t : null);
    same(200, $done['attempts'][0]['status_code']);
};

$tests['by key: read, reschedule, cancel'] = function () use ($url, $hooks) {
    $client = new Client($url, $hooks['token']);
    $key = 'order/' . uuid();
    $created = $client->create(['biz_type' => $hooks['name'], 'key' => $key, 'delay_ms' => 3_600_000, 'payload' => ['n' => 1]]);
    $found = $client->getByKey($hooks['name'], $key);
    same([$created['id'], ['n' => 1]], [$found['id'], $found['payload']]);
    $moved = $client->rescheduleByKey($hooks['name'], $key, ['run_at' => '2030-01-01T09:00:00Z', 'payload' => ['n' => 2]]);
    same([$created['id'], '2030-01-01T09:00:00Z', ['n' => 2]], [$moved['id'], $moved['run_at'], $moved['payload']]);
    same('cancelled', $client->cancelByKey($hooks['name'], $key)['status']);
    same('cancelled', $client->getByKey($hooks['name'], $key)['status']);
    $e = throws(InvalidStateException::class, fn () => $client->cancelByKey($hooks['name'], $key));
    same([409, 'invalid_state'], [$e->getStatus(), $e->getErrorCode()]);
    same('pending', $client->replay($created['id'])['status']);
    // Due now, so delivered.
    waitFor('succeeded', fn () => $client->getByKey($hooks['name'], $key)['status'] === 'succeeded');
};

$tests['deadlines: expires_at, ttl_ms'] = function () use ($url, $hooks) {
    $client = new Client($url, $hooks['token']);
    $at = $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000, 'expires_at' => '2031-01-01T00:00:00Z']);
    same('2031-01-01T00:00:00Z', $at['expires_at']);
    $ttl = $client->create(['biz_type' => $hooks['name'], 'run_at' => '2030-01-01T00:00:00Z', 'ttl_ms' => 60_000]);
    same('2030-01-01T00:01:00Z', $ttl['expires_at']);
    $e = throws(InvalidArgumentException::class, fn () => $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000, 'ttl_ms' => 0]));
    check(str_contains($e->getMessage(), 'ttl_ms'), $e->getMessage());
    $client->cancel($at['id']);
    $client->cancel($ttl['id']);
};

$tests['priority'] = function () use ($url, $hooks) {
    $client = new Client($url, $hooks['token']);
    $urgent = $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000, 'priority' => 8]);
    same(8, $urgent['priority']);
    $plain = $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000]);
    same(5, $plain['priority'], '5 when left out');
    same(2, $client->reschedule($urgent['id'], ['priority' => 2])['priority']);
    $e = throws(InvalidArgumentException::class, fn () => $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000, 'priority' => 10]));
    same(422, $e->getStatus());
    check(str_contains($e->getMessage(), 'priority'), $e->getMessage());
    $client->cancel($urgent['id']);
    $client->cancel($plain['id']);
};

$tests['flow key'] = function () use ($url, $hooks) {
    $client = new Client($url, $hooks['token']);
    $task = $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000, 'flow_key' => 'merchant-7']);
    same('merchant-7', $task['flow_key']);
    $plain = $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000]);
    same(null, $plain['flow_key'], 'null when left out');
    $e = throws(InvalidArgumentException::class, fn () => $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000, 'flow_key' => '']));
    same(422, $e->getStatus());
    check(str_contains($e->getMessage(), 'flow_key'), $e->getMessage());
    $client->cancel($task['id']);
    $client->cancel($plain['id']);
};

$tests['bulk cancel and replay'] = function () use ($url, $hooks) {
    $client = new Client($url, $hooks['token']);
    $prefix = 'bulk-' . uuid() . '-';
    $ids = [];
    for ($i = 0; $i < 3; $i++) {
        $ids[] = $client->create(['biz_type' => $hooks['name'], 'key' => "$prefix$i", 'delay_ms' => 3_600_000])['id'];
    }
    same(['matched' => 3, 'cancelled' => 0, 'more' => false], $client->cancelMatching($hooks['name'], ['key_prefix' => $prefix, 'dry_run' => true]));
    same(['matched' => 3, 'cancelled' => 3], $client->cancelMatching($hooks['name'], ['key_prefix' => $prefix]));
    foreach ($ids as $id) {
        same('cancelled', $client->get($id)['status']);
    }
    same(['matched' => 0, 'replayed' => 0], $client->replayMatching($hooks['name'], ['status' => 'failed', 'key_prefix' => $prefix]));
    throws(InvalidArgumentException::class, fn () => $client->cancelMatching($hooks['name'], []));
};

$tests['stats'] = function () use ($url, $hooks, $receiverUrl) {
    // A paused biz type of its own: its tasks stay as created.
    $quiet = biz('stats', ['callback_url' => $receiverUrl, 'paused' => true, 'max_in_flight' => 4]);
    $client = new Client($url, $quiet['token']);
    foreach ([0, 3_600_000, 3_600_000] as $delay) {
        $client->create(['biz_type' => $quiet['name'], 'delay_ms' => $delay]);
    }
    $stats = $client->stats($quiet['name']);
    same(['due' => 1, 'pending' => 3, 'running' => 0, 'retrying' => 0, 'failed' => 0, 'expired' => 0], $stats['counts']);
    same([$quiet['name'], 10_000, []], [$stats['biz_type'], $stats['count_cap'], $stats['capped']]);
    same(['count' => 0, 'max' => 4], $stats['in_flight']);
    same(['window_s' => 60, 'attempts' => 0, 'p50_ms' => null, 'p99_ms' => null], $stats['lateness']);
    same(true, $stats['oldest_due_age_ms'] >= 0);
    throws(PermissionDeniedException::class, fn () => (new Client($url, $hooks['token']))->stats($quiet['name']));
};

$tests['reschedule and cancel by id'] = function () use ($url, $hooks) {
    $client = new Client($url, $hooks['token']);
    $task = $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000]);
    same(null, $client->reschedule($task['id'], ['payload' => null])['payload']);
    same($task['id'], $client->reschedule($task['id'], ['delay_ms' => 7_200_000])['id']);
    same('cancelled', $client->cancel($task['id'])['status']);
    same([], $client->get($task['id'])['attempts']);
};

$tests['on_conflict: reject, replace, keep'] = function () use ($url, $hooks) {
    $client = new Client($url, $hooks['token']);
    $key = 'meeting-' . uuid();
    $request = ['biz_type' => $hooks['name'], 'key' => $key, 'delay_ms' => 3_600_000, 'payload' => ['v' => 1]];
    $first = $client->create($request);
    $again = $client->create($request);
    same([$first['id'], false], [$again['id'], $again['created']]);
    $e = throws(KeyConflictException::class, fn () => $client->create(['payload' => ['v' => 2]] + $request));
    same([409, 'key_conflict'], [$e->getStatus(), $e->getErrorCode()]);
    check(str_contains($e->getMessage(), $key), 'the message names the key');
    $replaced = $client->create(['biz_type' => $hooks['name'], 'key' => $key, 'run_at' => '2031-01-01T00:00:00Z', 'payload' => ['v' => 3], 'on_conflict' => 'replace']);
    same([$first['id'], '2031-01-01T00:00:00Z', ['v' => 3]], [$replaced['id'], $replaced['run_at'], $replaced['payload']]);
    $kept = $client->create(['biz_type' => $hooks['name'], 'key' => $key, 'payload' => ['v' => 4], 'on_conflict' => 'keep']);
    same([$first['id'], ['v' => 3], false], [$kept['id'], $kept['payload'], $kept['created']]);
    $client->cancelByKey($hooks['name'], $key);
};

$tests['batch'] = function () use ($url, $hooks) {
    $client = new Client($url, $hooks['token']);
    $key = 'batch-' . uuid();
    $results = $client->createBatch([
        ['biz_type' => $hooks['name'], 'key' => $key, 'delay_ms' => 3_600_000],
        ['biz_type' => $hooks['name'], 'key' => $key, 'delay_ms' => 3_600_000],
        ['biz_type' => $hooks['name'], 'run_at' => 'not a time'],
    ]);
    same([201, 200, 422], array_column($results, 'status'));
    same($results[0]['task']['id'], $results[1]['task']['id']);
    check($results[2]['error'] instanceof InvalidArgumentException, 'the third is invalid');
    check(str_contains($results[2]['error']->getMessage(), 'run_at'), 'naming run_at');
    $client->cancel($results[0]['task']['id']);
};

$tests['list iterates every page'] = function () use ($url, $receiverUrl) {
    $biz = biz('list', ['callback_url' => $receiverUrl]);
    $client = new Client($url, $biz['token']);
    $ids = [];
    for ($i = 0; $i < 7; $i++) {
        $ids[] = $client->create(['biz_type' => $biz['name'], 'delay_ms' => 3_600_000 + $i, 'payload' => ['i' => $i]])['id'];
    }
    same($ids, array_column(iterator_to_array($client->list(['status' => 'pending', 'limit' => 3]), false), 'id'));
    same(3, count($client->listPage(['limit' => 3])['items']));
    same([], iterator_to_array($client->list(['status' => 'succeeded']), false));
};

$tests['typed errors: 401, 403, 404, 409, 422'] = function () use ($url, $hooks, $other) {
    $client = new Client($url, $hooks['token']);
    $e = throws(UnauthenticatedException::class, fn () => (new Client($url, 'chime_not_a_token'))->get(uuid()));
    same([401, 'unauthenticated'], [$e->getStatus(), $e->getErrorCode()]);
    $theirs = (new Client($url, $other['token']))->create(['biz_type' => $other['name'], 'delay_ms' => 3_600_000]);
    same(403, throws(PermissionDeniedException::class, fn () => $client->get($theirs['id']))->getStatus());
    throws(PermissionDeniedException::class, fn () => $client->getByKey($other['name'], 'anything'));
    $e = throws(NotFoundException::class, fn () => $client->get(uuid()));
    same([404, 'not_found'], [$e->getStatus(), $e->getErrorCode()]);
    throws(NotFoundException::class, fn () => $client->getByKey($hooks['name'], 'never-' . uuid()));
    $e = throws(InvalidArgumentException::class, fn () => $client->create(['biz_type' => $hooks['name'], 'run_at' => 'tomorrow']));
    same(422, $e->getStatus());
    check(str_starts_with($e->getMessage(), 'run_at'), $e->getMessage());
    $done = $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000]);
    $client->cancel($done['id']);
    same(409, throws(InvalidStateException::class, fn () => $client->reschedule($done['id'], ['delay_ms' => 1000]))->getStatus());
};

$tests['a keyed create whose answer was lost is sent again with its key'] = function () use ($url, $hooks) {
    [$proxyUrl, $process, $out] = proxy();
    try {
        $client = new Client($proxyUrl, $hooks['token'], ['backoff' => 0.05]);
        $key = 'retry-' . uuid();
        $task = $client->create(['biz_type' => $hooks['name'], 'key' => $key, 'delay_ms' => 3_600_000, 'payload' => ['order' => 7]]);
        same(["dropped\n", "forwarded\n"], [fgets($out), fgets($out)], 'the first try was dropped, the second answered');
        same(false, $task['created'], 'the retry found the task the first try stored (200)');
        $direct = new Client($url, $hooks['token']);
        same($task['id'], $direct->getByKey($hooks['name'], $key)['id']);
        $mine = array_filter(iterator_to_array($direct->list(['status' => 'pending']), false), fn ($t) => $t['key'] === $key);
        same(1, count($mine));
        $direct->cancel($task['id']);
    } finally {
        proc_terminate($process);
    }
};

$tests['a keyed create answered 503 is sent again; an unkeyed one is not'] = function () use ($url, $hooks) {
    [$proxyUrl, $process, $out] = proxy('unavailable');
    [$unkeyedUrl, $unkeyedProcess, $unkeyedOut] = proxy('unavailable');
    try {
        $task = (new Client($proxyUrl, $hooks['token'], ['backoff' => 0.05]))->create(['biz_type' => $hooks['name'], 'key' => 'retry-' . uuid(), 'delay_ms' => 3_600_000]);
        same(["unavailable\n", "forwarded\n", true], [fgets($out), fgets($out), $task['created']]);
        (new Client($url, $hooks['token']))->cancel($task['id']);
        $e = throws(UnavailableException::class, fn () => (new Client($unkeyedUrl, $hooks['token'], ['backoff' => 0.05]))->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000]));
        same(503, $e->getStatus());
        same("unavailable\n", fgets($unkeyedOut));
    } finally {
        proc_terminate($process);
        proc_terminate($unkeyedProcess);
    }
};

$tests['an unkeyed create is not sent twice'] = function () use ($url, $hooks) {
    [$proxyUrl, $process, $out] = proxy();
    try {
        $client = new Client($proxyUrl, $hooks['token'], ['backoff' => 0.05]);
        $marker = uuid();
        throws(TransportException::class, fn () => $client->create(['biz_type' => $hooks['name'], 'delay_ms' => 3_600_000, 'payload' => ['marker' => $marker]]));
        same("dropped\n", fgets($out));
        $direct = new Client($url, $hooks['token']);
        $stored = array_values(array_filter(iterator_to_array($direct->list(['status' => 'pending']), false), fn ($t) => $t['payload'] === ['marker' => $marker]));
        same(1, count($stored), 'the server stored the one try; the client did not send another');
        $direct->cancel($stored[0]['id']);
    } finally {
        proc_terminate($process);
    }
};

$tests['timers'] = function () use ($url, $hooks) {
    $client = new Client($url, $hooks['token']);
    $key = 'nightly-' . uuid();
    $timer = $client->createTimer(['biz_type' => $hooks['name'], 'key' => $key, 'cron' => '0 30 2 * * *', 'timezone' => 'Europe/Berlin', 'payload' => ['report' => 'daily']]);
    same([$key, true, 'Europe/Berlin', 5], [$timer['key'], $timer['active'], $timer['timezone'], count($timer['next_fire_times'])]);
    same('0 30 2 * * *', $client->getTimer($timer['id'])['cron']);
    $changed = $client->updateTimer($timer['id'], ['cron' => '0 0 3 * * *', 'payload' => ['report' => 'weekly']]);
    same(['0 0 3 * * *', ['report' => 'weekly']], [$changed['cron'], $changed['payload']]);
    $off = $client->deactivateTimer($timer['id']);
    same([false, []], [$off['active'], $off['next_fire_times']]);
    same(true, $client->activateTimer($timer['id'])['active']);
    check(in_array($timer['id'], array_column(iterator_to_array($client->listTimers(1), false), 'id'), true), 'listed');
    throws(InvalidArgumentException::class, fn () => $client->updateTimer($timer['id'], ['cron' => 'every day']));
    $client->deleteTimer($timer['id']);
    throws(NotFoundException::class, fn () => $client->getTimer($timer['id']));
};

$tests['a consumer handles N tasks, then returns'] = function () use ($url, $pull) {
    $client = new Client($url, $pull['token']);
    $ids = [];
    for ($i = 0; $i < 5; $i++) {
        $ids[] = $client->create(['biz_type' => $pull['name'], 'payload' => ['i' => $i]])['id'];
    }
    $seen = [];
    $handled = $client->consumer($pull['name'], function (array $task) use (&$seen) { $seen[] = $task['id']; }, ['max' => 2, 'wait_ms' => 5000, 'limit' => 5])->run();
    same(5, $handled);
    sort($ids);
    sort($seen);
    same($ids, $seen);
    foreach ($ids as $id) {
        same('succeeded', $client->get($id)['status']);
    }
};

$tests['a failing handler nacks; stop() ends the loop'] = function () use ($url, $pull) {
    $client = new Client($url, $pull['token']);
    $task = $client->create(['biz_type' => $pull['name'], 'payload' => ['fail' => true]]);
    same(1, $client->consumer($pull['name'], function () { throw new RuntimeException('no stock'); }, ['wait_ms' => 5000, 'limit' => 1])->run());
    $after = $client->get($task['id']);
    same('pending', $after['status']);
    check(str_contains($after['last_error'], 'no stock'), $after['last_error']);
    $consumer = null;
    $consumer = $client->consumer($pull['name'], function () use (&$consumer) { $consumer->stop(); }, ['wait_ms' => 5000]);
    same(1, $consumer->run(), 'the handler stopped the loop after the retried task');
    same('succeeded', $client->get($task['id'])['status']);
};

$tests['reserve, touch, ack; a stale receipt'] = function () use ($url, $pull) {
    $client = new Client($url, $pull['token']);
    $task = $client->create(['biz_type' => $pull['name'], 'payload' => ['touch' => true]]);
    $reserved = waitFor('reserved', fn () => $client->reserve($pull['name'], ['wait_ms' => 2000, 'ttr_ms' => 5000]));
    same($task['id'], $reserved[0]['id']);
    $touched = $client->touch($task['id'], $reserved[0]['receipt'], 60000);
    check(strtotime($touched['reserved_until']) > strtotime($reserved[0]['reserved_until']), 'the reservation was extended');
    same('succeeded', $client->ack($task['id'], $reserved[0]['receipt'])['status']);
    throws(StaleReceiptException::class, fn () => $client->ack($task['id'], $reserved[0]['receipt']));
};

$failed = 0;
foreach ($tests as $name => $test) {
    $started = microtime(true);
    try {
        $test();
        printf("ok   %s (%.2f s)\n", $name, microtime(true) - $started);
    } catch (Throwable $e) {
        $failed++;
        printf("FAIL %s\n    %s: %s\n    at %s:%d\n", $name, get_class($e), $e->getMessage(), $e->getFile(), $e->getLine());
    }
}
printf("%d tests, %d failed\n", count($tests), $failed);
exit($failed > 0 ? 1 : 0);

<?php

declare(strict_types=1);

namespace Chime;

/**
 * The check of a callback's signature (docs/book/src/callbacks.md): chime's own
 * `Chime-Signature`, or Standard Webhooks' headers (docs/book/src/standard-webhooks.md).
 */
final class Signature
{
    /**
     * Whether $header (the `Chime-Signature` of a callback) signs $body, the request body
     * exactly as received (`file_get_contents('php://input')`).
     *
     * $secrets is the biz type's signing secret, or several (the old and the new one while a
     * rotation overlaps); the header may carry several `v1=` during a rotation too: any secret
     * matching any `v1` is enough. A `t` more than $tolerance seconds from $now (default: this
     * machine's clock), before or after, is refused, so that a captured callback cannot be
     * replayed later. Compares in constant time. A malformed header is simply not a valid
     * signature: this never throws.
     *
     * @param array<string>|string $secrets
     */
    public static function verify(string $body, ?string $header, array|string $secrets, int $tolerance = 300, ?int $now = null): bool
    {
        if ($header === null || $header === '') {
            return false;
        }
        $keys = array_values(array_filter(is_array($secrets) ? $secrets : [$secrets], fn ($s) => is_string($s) && $s !== ''));
        if ($keys === []) {
            return false;
        }
        $t = null;
        $sent = [];
        foreach (explode(',', $header) as $part) {
            $eq = strpos($part, '=');
            if ($eq === false) {
                return false;
            }
            $name = substr($part, 0, $eq);
            $value = substr($part, $eq + 1);
            if ($name === 't') {
                // ASCII digits only; the D modifier keeps `$` from matching before a final newline.
                if ($t !== null || !preg_match('/^[0-9]{1,12}$/D', $value)) {
                    return false;
                }
                $t = $value;
            } elseif ($name === 'v1') {
                $sent[] = $value;
            }
            // Other schemes (v0=…) are ignored, so that a later one can be added beside v1.
        }
        if ($t === null || $sent === []) {
            return false;
        }
        $clock = $now ?? time();
        if (abs($clock - (int) $t) > $tolerance) {
            return false;
        }
        $valid = false;
        foreach ($keys as $key) {
            $expected = hash_hmac('sha256', $t . '.' . $body, $key);
            foreach ($sent as $candidate) {
                // Every pair is compared, so the time taken does not say which one matched.
                if (preg_match('/^[0-9a-f]{64}$/D', $candidate) && hash_equals($expected, $candidate)) {
                    $valid = true;
                }
            }
        }
        return $valid;
    }

    /**
     * Whether a callback or failure notice is signed, in either of a biz type's signing
     * schemes. $headers are the request's, names in any case (`getallheaders()`).
     *
     * With a `webhook-signature` (a biz type whose `signing_scheme` is `standard-webhooks`):
     * `v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">`, keyed by the
     * base64-decoded part of each `whsec_` secret, several space-separated during a rotation;
     * any secret matching any `v1` is enough. Otherwise the `Chime-Signature`, as `verify`
     * checks it. $body, $secrets, $tolerance and $now are as `verify` takes them. Never throws
     * on malformed headers.
     *
     * @param array<string, string> $headers
     * @param array<string>|string $secrets
     */
    public static function verifyWebhook(string $body, array $headers, array|string $secrets, int $tolerance = 300, ?int $now = null): bool
    {
        $lowered = [];
        foreach ($headers as $name => $value) {
            $lowered[strtolower((string) $name)] = is_string($value) ? $value : null;
        }
        if (!array_key_exists('webhook-signature', $lowered)) {
            return self::verify($body, $lowered['chime-signature'] ?? null, $secrets, $tolerance, $now);
        }
        $signature = $lowered['webhook-signature'];
        $id = $lowered['webhook-id'] ?? null;
        $t = $lowered['webhook-timestamp'] ?? null;
        if (!$signature || !$id || $t === null || !preg_match('/^[0-9]{1,12}$/D', $t)) {
            return false;
        }
        $keys = [];
        foreach (is_array($secrets) ? $secrets : [$secrets] as $secret) {
            $key = self::whsecKey($secret);
            if ($key !== null) {
                $keys[] = $key;
            }
        }
        if ($keys === []) {
            return false;
        }
        $clock = $now ?? time();
        if (abs($clock - (int) $t) > $tolerance) {
            return false;
        }
        $sent = [];
        foreach (explode(' ', $signature) as $part) {
            if (str_starts_with($part, 'v1,')) {
                $sent[] = substr($part, 3);
            }
        }
        $valid = false;
        foreach ($keys as $key) {
            $expected = base64_encode(hash_hmac('sha256', $id . '.' . $t . '.' . $body, $key, true));
            foreach ($sent as $candidate) {
                // Every pair is compared, so the time taken does not say which one matched.
                if (hash_equals($expected, $candidate)) {
                    $valid = true;
                }
            }
        }
        return $valid;
    }

    /** The key of a `whsec_<base64>` secret; null for a secret not in that form. */
    private static function whsecKey(mixed $secret): ?string
    {
        if (!is_string($secret) || !str_starts_with($secret, 'whsec_')) {
            return null;
        }
        $encoded = substr($secret, strlen('whsec_'));
        if (!preg_match('/^(?:[A-Za-z0-9+\/]{4})*(?:[A-Za-z0-9+\/]{2}==|[A-Za-z0-9+\/]{3}=)?$/D', $encoded)) {
            return null;
        }
        $key = base64_decode($encoded, true);
        return $key === false || $key === '' ? null : $key;
    }
}

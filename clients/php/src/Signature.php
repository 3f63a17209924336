<?php

declare(strict_types=1);

namespace Chime;

/** The check of a callback's `Chime-Signature` header (docs/book/src/callbacks.md). */
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
}

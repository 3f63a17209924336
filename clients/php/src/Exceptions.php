<?php

declare(strict_types=1);

namespace Chime;

/**
 * An answer of the API that is an error (`{"error": {"code", "message"}}`), or no answer.
 * getStatus() is the HTTP status (0 when no answer came, also getCode()), getErrorCode() the
 * API's code (`key_conflict`, `not_found`…), getMessage() its explanation, getRetryAfter()
 * the seconds a 429 or 503 asked to wait, if it did.
 */
class ApiException extends \RuntimeException
{
    public const ERROR_CODE = 'error';

    public function __construct(string $message, private int $status = 0, private ?string $errorCode = null, private ?float $retryAfter = null, ?\Throwable $previous = null)
    {
        parent::__construct($message, $status, $previous);
        $this->errorCode ??= static::ERROR_CODE;
    }

    public function getStatus(): int
    {
        return $this->status;
    }

    public function getErrorCode(): string
    {
        return $this->errorCode;
    }

    public function getRetryAfter(): ?float
    {
        return $this->retryAfter;
    }

    private const BY_CODE = [
        'bad_request' => BadRequestException::class,
        'unauthenticated' => UnauthenticatedException::class,
        'permission_denied' => PermissionDeniedException::class,
        'not_found' => NotFoundException::class,
        'method_not_allowed' => MethodNotAllowedException::class,
        'request_timeout' => RequestTimeoutException::class,
        'conflict' => ConflictException::class,
        'key_conflict' => KeyConflictException::class,
        'task_running' => TaskRunningException::class,
        'invalid_state' => InvalidStateException::class,
        'stale_receipt' => StaleReceiptException::class,
        'payload_too_large' => PayloadTooLargeException::class,
        'invalid_argument' => InvalidArgumentException::class,
        'rate_limited' => RateLimitedException::class,
        'unavailable' => UnavailableException::class,
        'internal' => InternalException::class,
    ];

    private const BY_STATUS = [
        400 => BadRequestException::class, 401 => UnauthenticatedException::class,
        403 => PermissionDeniedException::class, 404 => NotFoundException::class,
        405 => MethodNotAllowedException::class, 408 => RequestTimeoutException::class,
        409 => ConflictException::class, 413 => PayloadTooLargeException::class,
        422 => InvalidArgumentException::class, 429 => RateLimitedException::class,
        500 => InternalException::class, 503 => UnavailableException::class,
    ];

    /** The exception for an answer: by its code, else (a code unknown here, or an answer that is not chime's JSON) by its status. */
    public static function fromAnswer(int $status, ?string $code, string $message, ?float $retryAfter = null): self
    {
        $class = self::BY_CODE[$code ?? ''] ?? self::BY_STATUS[$status] ?? self::class;
        return new $class($message, $status, $code, $retryAfter);
    }
}

/** No answer: the connection failed, broke or timed out. The request may have been done. */
class TransportException extends ApiException { public const ERROR_CODE = 'transport'; }
class BadRequestException extends ApiException { public const ERROR_CODE = 'bad_request'; }
class UnauthenticatedException extends ApiException { public const ERROR_CODE = 'unauthenticated'; }
class PermissionDeniedException extends ApiException { public const ERROR_CODE = 'permission_denied'; }
class NotFoundException extends ApiException { public const ERROR_CODE = 'not_found'; }
class MethodNotAllowedException extends ApiException { public const ERROR_CODE = 'method_not_allowed'; }
class RequestTimeoutException extends ApiException { public const ERROR_CODE = 'request_timeout'; }
/** 409; the subclasses say which conflict it is. */
class ConflictException extends ApiException { public const ERROR_CODE = 'conflict'; }
/** 409: the key is held by a task created by a different request. */
class KeyConflictException extends ConflictException { public const ERROR_CODE = 'key_conflict'; }
/** 409: an `on_conflict: replace` met the key's task running. */
class TaskRunningException extends ConflictException { public const ERROR_CODE = 'task_running'; }
/** 409: the operation needs another state (cancelling a finished task…). */
class InvalidStateException extends ConflictException { public const ERROR_CODE = 'invalid_state'; }
/** 409: a pull receipt whose reservation is over; drop the task. */
class StaleReceiptException extends ConflictException { public const ERROR_CODE = 'stale_receipt'; }
class PayloadTooLargeException extends ApiException { public const ERROR_CODE = 'payload_too_large'; }
/** 422: a field is invalid; the message names it. */
class InvalidArgumentException extends ApiException { public const ERROR_CODE = 'invalid_argument'; }
/** 429: the biz type's create rate limit; getRetryAfter() says when to try again. */
class RateLimitedException extends ApiException { public const ERROR_CODE = 'rate_limited'; }
/** 503: the database cannot be reached, or chime is starting or stopping; retry. */
class UnavailableException extends ApiException { public const ERROR_CODE = 'unavailable'; }
class InternalException extends ApiException { public const ERROR_CODE = 'internal'; }

"""What an object store's failure is: a permanent one (denied, missing, changed) by its code,
or a transient one (throttling, a server's trouble, a timeout, a connection cut) worth another
try under the `RetryPolicy`. Library exceptions are told apart by their codes and type names, so
that no SDK needs importing to classify what it raised."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "CHANGED",
    "DENIED",
    "MISSING",
    "NO_BUCKET",
    "TRANSIENT",
    "ShortAnswerError",
    "error_code",
    "transient_kind",
]

# S3 and Azure error codes and HTTP statuses worth another try: throttling, a server's own
# trouble.
TRANSIENT = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "ServerBusy",
    "OperationTimedOut",
    "429",
    "500",
    "502",
    "503",
    "504",
}
DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "AuthenticationFailed",
    "AuthorizationFailure",
    "401",
    "403",
}
MISSING = {"NoSuchKey", "NoSuchBucket", "BlobNotFound", "ContainerNotFound", "404"}
NO_BUCKET = {"NoSuchBucket", "ContainerNotFound"}
CHANGED = {"PreconditionFailed", "ConditionNotMet", "412"}


def error_code(exc: BaseException) -> str:
    """The store's error code (S3's or Azure's) or else the HTTP status behind ``exc``,
    following its causes; "" if none."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        response = getattr(seen, "response", None)
        if isinstance(response, Mapping):  # botocore
            error = response.get("Error") or {}
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode", "")
            return str(error.get("Code") or status)
        azure = getattr(seen, "error_code", None)
        if isinstance(azure, str) and azure:  # azure.core's HttpResponseError
            return azure
        for name in ("status_code", "status", "code"):  # azure.core, aiohttp, gcsfs
            status = getattr(seen, name, None)
            if isinstance(status, int) and 100 <= status <= 599:
                return str(status)
        seen = seen.__cause__ or seen.__context__
    return ""


_TIMED_OUT = {
    "TimeoutError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "FSTimeoutError",
    "ServerTimeoutError",
    "AioReadTimeoutError",
    "timeout",
}
_UNREACHABLE = {
    "EndpointConnectionError",
    "ClientConnectorError",
    "ConnectionError",
    "ConnectionRefusedError",
}
# The connection broke under a request, or its body ended before its Content-Length.
_CUT = {
    "ConnectionResetError",
    "BrokenPipeError",
    "ClientPayloadError",
    "ContentLengthError",
    "ServerDisconnectedError",
    "ClientOSError",
    "IncompleteReadError",
    "IncompleteRead",
    "ResponseStreamingError",
    "ProtocolError",
    "ServiceResponseError",
    "ShortAnswerError",
}


def _names(exc: BaseException) -> set[str]:
    """The type names of ``exc`` and of its causes and contexts."""
    names: set[str] = set()
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        names.add(type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    return names


def transient_kind(exc: BaseException) -> str:
    """What makes ``exc`` worth another try ("" if nothing does): throttling or a server's own
    trouble (its code), a timeout, an unreachable endpoint, a connection cut mid-answer."""
    code, names = error_code(exc), _names(exc)
    if code in TRANSIENT:
        return code
    if names & _TIMED_OUT:
        return "timed out"
    if names & _CUT:
        return "connection cut"
    if names & _UNREACHABLE:
        return "unreachable"
    return ""


class ShortAnswerError(Exception):
    """A response that ended without an error, short of the bytes asked for."""

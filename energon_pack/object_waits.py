"""Bounded waits on object storage: a stalled object fails within a budget, in one error that names it.

multi-storage-client (1.3) waits up to 60 s to connect and 60 s for each read of an S3 answer, lets
botocore retry a request up to 3 times and retries the whole call 3 times more: a store that accepts a
request and never answers holds a loader worker for about 9-15 minutes per object, with nothing said
but retry warnings. :func:`configure_object_waits` sets the connect and read timeouts of the S3
profiles that do not set their own (``connect_timeout`` / ``read_timeout`` in the MSC config keep
theirs) and puts a wall-clock budget on MSC's retries of a read: once the next attempt could not
finish within ``wait_budget`` seconds, the call ends in :class:`ObjectStoreTimeout` naming the object,
the time waited and the knob. An object that is missing stays ``FileNotFoundError``; a denied one
``PermissionError``.

It replaces the timeout defaults of MSC's S3 provider module and three methods of its
``SingleStorageClient`` (``read``, ``download_file``: retried; ``info``: one HEAD) in this process;
loader workers forked afterwards (Energon's default on Linux) inherit it. Call it before the loader
or any ``msc://`` path is built: a storage client keeps the timeouts it was made with. The
``energon-pack`` commands call it for every run (``--object-timeout``, ``--object-wait-budget``).
"""

from __future__ import annotations

import functools
import time
from typing import Any

from energon_pack.errors import ConfigError
from energon_pack.storage import msc_missing

#: seconds to open a connection to the store, for profiles that set no ``connect_timeout``
DEFAULT_CONNECT_TIMEOUT = 10.0
#: seconds to wait for each read of an answer, for profiles that set no ``read_timeout``
DEFAULT_READ_TIMEOUT = 10.0
#: seconds one object may take across all retries before it is given up
DEFAULT_WAIT_BUDGET = 60.0

#: the MSC methods this module bounds: the retried reads, and the HEAD that is not retried
_METHODS = ("read", "download_file", "info")
_ORIGINAL: dict[str, Any] = {}


class ObjectStoreTimeout(ConfigError):
    """An object the store did not deliver within the wait budget (or the request timeouts)."""

    def __init__(
        self, url: str, waited: float, attempts: int, allowed: int, budget: float, last: BaseException
    ) -> None:
        super().__init__(
            "wait_budget",
            f"{url}: not delivered after {waited:.0f} s (attempt {attempts} of {allowed}, {budget:g} s wait budget; "
            f"last error: {_root_name(last)})",
            "check that the store answers (endpoint, network); a slow store needs a larger wait_budget "
            "(per-request timeouts: configure_object_waits' read_timeout, or connect_timeout / read_timeout "
            "in the MSC profile)",
        )
        self.url, self.waited, self.attempts = url, waited, attempts


def _root_name(exc: BaseException) -> str:
    """The type name of the first error in ``exc``'s chain of causes (botocore's, under MSC's wrapper)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return type(exc).__name__


def configure_object_waits(
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    wait_budget: float | None = DEFAULT_WAIT_BUDGET,
) -> None:
    """Bound how long a read from object storage may wait; ``wait_budget=None`` restores MSC's own waits.

    Call it before building the loader (forked workers inherit it) and before the first ``msc://`` path.

    Args:
        connect_timeout: seconds to open a connection, for S3 profiles without their own. Default 10.
        read_timeout: seconds to wait for each read of an answer, for S3 profiles without their own.
            Default 10; one attempt of a stalled request then takes about 3 x 10 s (botocore's 3 tries).
        wait_budget: seconds one object may take across MSC's retries; no attempt starts that could not end
            within it, and the last failure is an :class:`ObjectStoreTimeout`. Default 60.
    """
    for knob, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
        _check_seconds(knob, value)
    if wait_budget is not None:
        _check_seconds("wait_budget", wait_budget)
    s3, client_class = _msc_parts()
    if wait_budget is None:
        s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT = _ORIGINAL["timeouts"]
        for name in _METHODS:
            setattr(client_class, name, _ORIGINAL[name])
        return
    s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT = connect_timeout, read_timeout
    for name in _METHODS:
        setattr(client_class, name, _bounded(_ORIGINAL[name], wait_budget, retried=name != "info"))


def _check_seconds(knob: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(knob, f"must be a number of seconds > 0, got {value!r}", f"pass e.g. {knob}=30")


def _bounded(method: Any, budget: float, *, retried: bool) -> Any:
    """``method`` (MSC's, without its retry loop) retried as MSC would, within ``budget`` seconds."""
    from multistorageclient.retry import sleep_before_retry
    from multistorageclient.types import RetryableError

    inner = getattr(method, "__wrapped__", method)

    @functools.wraps(method)
    def call(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        config = getattr(self, "_retry_config", None) if retried else None
        attempts = config.attempts if config is not None else 1
        start, longest = time.monotonic(), 0.0
        for attempt in range(attempts):
            began = time.monotonic()
            try:
                return inner(self, path, *args, **kwargs)
            except (FileNotFoundError, PermissionError):
                raise
            except Exception as exc:
                if not isinstance(exc, RetryableError) and not _is_timeout(exc):
                    raise
                now = time.monotonic()
                longest = max(longest, now - began)
                delay = config.delay * config.backoff_multiplier**attempt + 1.0 if config is not None else 0.0
                if attempt == attempts - 1 or now - start + delay + longest > budget:
                    url = f"msc://{getattr(self, 'profile', '?')}/{str(path).lstrip('/')}"
                    raise ObjectStoreTimeout(url, now - start, attempt + 1, attempts, budget, exc) from None
                sleep_before_retry(config, attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    return call


def _is_timeout(exc: BaseException) -> bool:
    """A connect or read timeout however MSC passed it on (a HEAD is not translated; a failed connection
    reaches a read as RuntimeError with botocore's error as its cause)."""
    seen: BaseException | None = exc
    while seen is not None:
        name = type(seen).__name__
        if "Timeout" in name or name in ("EndpointConnectionError", "ConnectionClosedError"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _msc_parts() -> tuple[Any, type]:
    """MSC's S3 provider module and ``SingleStorageClient``, originals kept once; a ConfigError for a
    release that is built otherwise (the version gate)."""
    try:
        import multistorageclient.providers.s3 as s3
        from multistorageclient.client.single import SingleStorageClient
    except ImportError as exc:
        raise msc_missing(exc) from None
    if not _ORIGINAL:
        methods = {name: getattr(SingleStorageClient, name, None) for name in _METHODS}
        if (
            not hasattr(s3, "DEFAULT_CONNECT_TIMEOUT")
            or not hasattr(s3, "DEFAULT_READ_TIMEOUT")
            or any(m is None for m in methods.values())
            or not hasattr(methods["read"], "__wrapped__")
        ):
            raise ConfigError(
                "object storage",
                "this multi-storage-client release is built differently from 1.3 (S3 timeout defaults, "
                "SingleStorageClient.read / download_file / info)",
                "pass wait_budget=None (MSC's own waits), or install multi-storage-client 1.3",
            )
        _ORIGINAL.update(methods, timeouts=(s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT))
    return s3, SingleStorageClient

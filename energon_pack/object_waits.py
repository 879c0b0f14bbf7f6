"""Bounded waits on object storage, by default: a stalled or dripping object fails within a budget, in one error
that names it.

multi-storage-client (1.3) waits up to 60 s to connect and 60 s for each read of an S3 answer, lets
botocore retry a request up to 3 times and retries the whole call 3 times more: a store that accepts a
request and never answers holds a loader worker for about 9-15 minutes per object, with nothing said
but retry warnings, and one that sends a byte now and then (each read gets one within any read timeout)
holds it for good. :func:`configure_object_waits` sets the connect and read timeouts of the S3
profiles that do not set their own (``connect_timeout`` / ``read_timeout`` in the MSC config keep
theirs) and puts a wall-clock budget on a read: MSC's retries start no attempt that could not finish within
``wait_budget`` seconds, botocore sends no new try after it, and a response body still arriving then is cut off
(its socket shut down). The call ends in :class:`ObjectStoreTimeout` naming the object, the time waited and the
knob, also from a loader worker (MSC's ``OSError`` wrapper is taken off; torch's re-raise keeps our line). An
object that is missing stays ``FileNotFoundError``; a denied one ``PermissionError``.

It replaces the timeout defaults of MSC's S3 provider module, three methods of its ``SingleStorageClient``
(``read``, ``download_file``: retried; ``info``: one HEAD) and ``ObjectFile._wait_for_download`` in this process,
and hooks botocore's events of MSC's S3 clients; loader workers forked afterwards (Energon's default on Linux)
inherit it. :func:`install_default_object_waits` installs the defaults when one of our task encoders or an
``msc://`` :func:`~energon_pack.storage.epath` is built, unless the user called :func:`configure_object_waits`
(``wait_budget=None``: MSC's own waits, kept). The ``energon-pack`` commands call it for every run
(``--object-timeout``, ``--object-wait-budget``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
import threading
import time
import warnings
from typing import Any

from energon_pack.errors import ConfigError

#: seconds to open a connection to the store, for profiles that set no ``connect_timeout``
DEFAULT_CONNECT_TIMEOUT = 10.0
#: seconds to wait for each read of an answer, for profiles that set no ``read_timeout``
DEFAULT_READ_TIMEOUT = 10.0
#: seconds one object may take across all retries before it is given up
DEFAULT_WAIT_BUDGET = 60.0

#: environment variables read by the default install (:func:`install_default_object_waits`): seconds to connect and
#: to wait for each read of an answer, and the wait budget in seconds (``none``: MSC's own waits)
TIMEOUT_ENV, WAIT_BUDGET_ENV = "ENERGON_PACK_OBJECT_TIMEOUT", "ENERGON_PACK_OBJECT_WAIT_BUDGET"

#: the MSC methods this module bounds: the retried reads, and the HEAD that is not retried
_METHODS = ("read", "download_file", "info")
_ORIGINAL: dict[str, Any] = {}
#: ``budget``: the wait budget in force (None: MSC's own waits); ``chosen``: the user called configure_object_waits,
#: so the default install leaves the waits alone
_STATE: dict[str, Any] = {"budget": None, "chosen": False}
#: ``deadline``: when the bounded call running in this thread must end (monotonic seconds); bodies it reads end then
_LOCAL = threading.local()


class ObjectStoreTimeout(ConfigError):
    """An object the store did not deliver within the wait budget (or the request timeouts).

    Built from one message (``ObjectStoreTimeout(text)``: torch re-raises a loader worker's error as its type called
    with the worker's traceback text), it is the worker's own error again: the line of the text that holds it.
    """

    def __init__(
        self,
        url: str,
        waited: float | None = None,
        attempts: int = 1,
        allowed: int = 1,
        budget: float = 0.0,
        last: BaseException | None = None,
    ) -> None:
        if waited is None:
            found = _OWN_LINE.search(url)
            if found is None:  # not a worker's traceback: the text as it is
                ValueError.__init__(self, url)
                self.knob, self.problem, self.fix, self.url, self.waited, self.attempts = (
                    "wait_budget",
                    url,
                    "",
                    "",
                    0,
                    0,
                )
                return
            super().__init__("wait_budget", found["problem"], found["fix"])
            self.url, self.waited, self.attempts = found["url"], float(found["waited"]), int(found["attempts"])
            return
        super().__init__(
            "wait_budget",
            f"{url}: not delivered after {waited:.0f} s (attempt {attempts} of {allowed}, {budget:g} s wait budget; "
            f"last error: {_root_name(last) if last is not None else 'none'})",
            "check that the store answers (endpoint, network); a slow store needs a larger wait_budget "
            "(per-request timeouts: configure_object_waits' read_timeout, or connect_timeout / read_timeout "
            "in the MSC profile)",
        )
        self.url, self.waited, self.attempts = url, waited, attempts


#: our error's line in a worker's traceback text (the last one: a chained traceback ends with the outermost error)
_OWN_LINE = re.compile(
    rf"^{re.escape(__name__)}\.ObjectStoreTimeout: wait_budget: (?P<problem>(?P<url>.+?): not delivered after "
    r"(?P<waited>\d+(?:\.\d+)?) s \(attempt (?P<attempts>\d+) .*\))\. Fix: (?P<fix>.*)$",
    re.MULTILINE,
)


def msc_missing(exc: ImportError) -> ConfigError:
    """The one-line error for a missing multi-storage-client (the ``s3`` extra)."""
    return ConfigError(
        "object storage", f"multi-storage-client is not importable ({exc})", "pip install 'energon-pack[s3]'"
    )


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

    The waits are bounded by default (:func:`install_default_object_waits`); a call here is the user's choice, which
    the default install then leaves alone. Call it before building the loader (forked workers inherit it) and before
    the first ``msc://`` path.

    Args:
        connect_timeout: seconds to open a connection, for S3 profiles without their own. Default 10.
        read_timeout: seconds to wait for each read of an answer, for S3 profiles without their own.
            Default 10; one attempt of a stalled request then takes about 3 x 10 s (botocore's 3 tries).
        wait_budget: seconds one object may take across MSC's retries, a body still arriving included (a store
            that drips bytes); no attempt starts that could not end within it, and the last failure is an
            :class:`ObjectStoreTimeout`. Default 60.
    """
    _apply(connect_timeout, read_timeout, wait_budget)
    _STATE["chosen"] = True


def install_default_object_waits() -> bool:
    """The default waits, unless the user chose waits with :func:`configure_object_waits`; True when bounded waits
    are in force afterwards (idempotent). Called where the library reads object storage: when one of our task
    encoders is built and when :func:`~energon_pack.storage.epath` reaches an ``msc://`` path.

    ``$ENERGON_PACK_OBJECT_TIMEOUT`` (connect and read seconds) and ``$ENERGON_PACK_OBJECT_WAIT_BUDGET`` (seconds, or
    ``none`` for MSC's own waits) change the defaults. Without multi-storage-client nothing is installed; on a release
    built otherwise than 1.3, nothing either, with one warning.
    """
    if _STATE["chosen"] or _STATE["budget"] is not None:
        return _STATE["budget"] is not None
    try:
        import multistorageclient  # noqa: F401
    except ImportError:
        return False
    timeout = _env_seconds(TIMEOUT_ENV, DEFAULT_READ_TIMEOUT)
    budget = _env_seconds(WAIT_BUDGET_ENV, DEFAULT_WAIT_BUDGET)
    if budget is None:
        return False
    try:
        _apply(timeout, timeout, budget)
    except ConfigError as exc:  # another MSC layout: warn once, MSC's own waits stay
        if not _STATE.get("warned"):
            _STATE["warned"] = True
            warnings.warn(f"object-storage waits are not bounded: {exc}", RuntimeWarning, stacklevel=2)
        return False
    return True


def _env_seconds(name: str, default: float) -> float | None:
    """Seconds from the environment variable ``name`` (``none``: None), else ``default``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if text.lower() == "none" and name == WAIT_BUDGET_ENV:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        fix = f"set {name} to a number of seconds > 0" + (
            " or none (MSC's own waits)" if name == WAIT_BUDGET_ENV else ""
        )
        raise ConfigError(name, f"must be a number of seconds > 0, got {text!r}", fix)
    return value


def _apply(connect_timeout: float, read_timeout: float, wait_budget: float | None) -> None:
    """Install the waits (``wait_budget`` None: MSC's own)."""
    for knob, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
        _check_seconds(knob, value)
    if wait_budget is not None:
        _check_seconds("wait_budget", wait_budget)
    elif not _ORIGINAL:  # nothing was installed: MSC's own waits are in force
        _STATE["budget"] = None
        return
    s3, client_class, file_class = _msc_parts()
    _STATE["budget"] = wait_budget
    if wait_budget is None:
        s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT = _ORIGINAL["timeouts"]
        for name in _METHODS:
            setattr(client_class, name, _ORIGINAL[name])
        file_class._wait_for_download = _ORIGINAL["_wait_for_download"]
        return
    s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT = connect_timeout, read_timeout
    for name in _METHODS:
        setattr(client_class, name, _bounded(_ORIGINAL[name], wait_budget, retried=name != "info"))
    file_class._wait_for_download = _unwrapped_timeout(_ORIGINAL["_wait_for_download"])


def _check_seconds(knob: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(knob, f"must be a number of seconds > 0, got {value!r}", f"pass e.g. {knob}=30")


def _bounded(method: Any, budget: float, *, retried: bool) -> Any:
    """``method`` (MSC's, without its retry loop) retried as MSC would, within ``budget`` seconds; response bodies
    read meanwhile in this thread end with the budget too (:class:`_DeadlineBody`)."""
    from multistorageclient.retry import sleep_before_retry
    from multistorageclient.types import RetryableError

    inner = getattr(method, "__wrapped__", method)

    @functools.wraps(method)
    def call(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        config = getattr(self, "_retry_config", None) if retried else None
        attempts = config.attempts if config is not None else 1
        start, longest = time.monotonic(), 0.0
        _watch_bodies(self)
        outer = getattr(_LOCAL, "deadline", None)
        _LOCAL.deadline = start + budget if outer is None else min(outer, start + budget)
        try:
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
        finally:
            _LOCAL.deadline = outer

    return call


def _unwrapped_timeout(method: Any) -> Any:
    """MSC's ``ObjectFile._wait_for_download``, raising our :class:`ObjectStoreTimeout` itself rather than the
    ``OSError("Failed to download file ...")`` MSC wraps every failed download in: the object, the seconds and the
    knob stay in the error (a loader worker's error reaches the main process as its type and text), and Energon's
    reader, which reopens a file up to 10 times on an OSError, does not wait the budget ten times over."""

    @functools.wraps(method)
    def _wait_for_download(self: Any) -> None:
        try:
            method(self)
        except OSError as exc:
            if isinstance(exc.__cause__, ObjectStoreTimeout):
                raise exc.__cause__ from None
            raise

    return _wait_for_download


def _watch_bodies(client: Any) -> None:
    """Hook ``client``'s S3 connection (once per connection): its GetObject bodies end at the deadline
    (:func:`_deadline_body`), and botocore starts no new try of a request after it (:func:`_no_try_after_deadline`)."""
    s3 = getattr(getattr(client, "_storage_provider", None), "_s3_client", None)
    events = getattr(getattr(s3, "meta", None), "events", None)
    if events is not None:
        events.register("after-call.s3.GetObject", _deadline_body, unique_id=f"{__name__}.deadline_body")
        events.register("before-send.s3", _no_try_after_deadline, unique_id=f"{__name__}.no_try_after_deadline")


def _no_try_after_deadline(**_: Any) -> None:
    """botocore's ``before-send`` hook: inside a bounded call whose budget is spent, the next try of a request (botocore
    retries a timed-out one up to 3 times) is not sent; the error ends botocore's retries (it is not one it retries)."""
    deadline = getattr(_LOCAL, "deadline", None)
    if _STATE["budget"] is not None and deadline is not None and time.monotonic() >= deadline:
        raise WaitBudgetTimeout(f"the {_STATE['budget']:g} s wait budget was spent before botocore's next try")


def _deadline_body(parsed: Any = None, **_: Any) -> None:
    """botocore's ``after-call`` hook: a GetObject body whose reads end at the deadline of the bounded call of this
    thread, else (a transfer thread of a multipart download) ``wait_budget`` seconds from now."""
    budget = _STATE["budget"]
    if budget is None or not isinstance(parsed, dict) or "Body" not in parsed:
        return
    deadline = getattr(_LOCAL, "deadline", None) or time.monotonic() + budget
    parsed["Body"] = _DeadlineBody(parsed["Body"], deadline, budget)


class WaitBudgetTimeout(Exception):
    """The wait budget spent with a body still arriving or before a request's next try (not an OSError: s3transfer
    retries those)."""


class _DeadlineBody:
    """A botocore ``StreamingBody`` whose reads end at ``deadline``: a read still running then has its socket shut
    down and raises :class:`WaitBudgetTimeout`. A store that sends a byte now and then passes every read timeout; only a
    wall-clock bound on the body ends it."""

    def __init__(self, body: Any, deadline: float, budget: float) -> None:
        self._body, self._deadline, self._budget = body, deadline, budget

    def read(self, amt: int | None = None) -> bytes:
        return self._bounded(self._body.read, amt)

    def readinto(self, b: Any) -> int:
        return self._bounded(self._body.readinto, b)

    def _bounded(self, read: Any, arg: Any) -> Any:
        left = self._deadline - time.monotonic()
        sock = _socket_of(self._body)
        if left <= 0 and sock is not None:
            self._body.close()
            raise WaitBudgetTimeout(f"the body was still arriving after the {self._budget:g} s wait budget")
        cut = _Cut(sock, left) if sock is not None else None
        try:
            return read(arg)
        except Exception:
            if cut is not None and cut.fired:
                raise WaitBudgetTimeout(
                    f"the body was still arriving after the {self._budget:g} s wait budget"
                ) from None
            raise
        finally:
            if cut is not None:
                cut.cancel()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)

    def __iter__(self) -> Any:
        return self.iter_chunks()

    def iter_chunks(self, chunk_size: int = 1024) -> Any:
        while chunk := self.read(chunk_size):
            yield chunk

    def __enter__(self) -> _DeadlineBody:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._body.close()


def _socket_of(body: Any) -> socket.socket | None:
    """The socket a botocore body reads from (where botocore's own ``set_socket_timeout`` reaches it); None once
    the body is read (the connection went back to its pool)."""
    try:
        return body._raw_stream._fp.fp.raw._sock
    except AttributeError:
        return None


class _Cut:
    """Shut ``sock`` down after ``seconds`` unless cancelled first: a blocked read on it then returns at once."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.fired, self._done, self._lock = False, False, threading.Lock()
        self._timer = threading.Timer(seconds, self._fire, (sock,))
        self._timer.daemon = True
        self._timer.start()

    def _fire(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._done:
                self.fired = True
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()


def _is_timeout(exc: BaseException) -> bool:
    """A connect or read timeout however MSC passed it on (a HEAD is not translated; a failed connection
    reaches a read as RuntimeError with botocore's error as its cause), or a body cut at the budget's end."""
    seen: BaseException | None = exc
    while seen is not None:
        name = type(seen).__name__
        if "Timeout" in name or name in ("EndpointConnectionError", "ConnectionClosedError"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _msc_parts() -> tuple[Any, type, type]:
    """MSC's S3 provider module, ``SingleStorageClient`` and ``ObjectFile``, originals kept once; a ConfigError for a
    release that is built otherwise (the version gate)."""
    try:
        import multistorageclient.providers.s3 as s3
        from multistorageclient.client.single import SingleStorageClient
        from multistorageclient.file import ObjectFile
    except ImportError as exc:
        raise msc_missing(exc) from None
    if not _ORIGINAL:
        methods = {name: getattr(SingleStorageClient, name, None) for name in _METHODS}
        if (
            not hasattr(s3, "DEFAULT_CONNECT_TIMEOUT")
            or not hasattr(s3, "DEFAULT_READ_TIMEOUT")
            or any(m is None for m in methods.values())
            or not hasattr(methods["read"], "__wrapped__")
            or not hasattr(ObjectFile, "_wait_for_download")
        ):
            raise ConfigError(
                "object storage",
                "this multi-storage-client release is built differently from 1.3 (S3 timeout defaults, "
                "SingleStorageClient.read / download_file / info, ObjectFile._wait_for_download)",
                "pass wait_budget=None (MSC's own waits), or install multi-storage-client 1.3",
            )
        _ORIGINAL.update(
            methods,
            timeouts=(s3.DEFAULT_CONNECT_TIMEOUT, s3.DEFAULT_READ_TIMEOUT),
            _wait_for_download=ObjectFile._wait_for_download,
        )
    return s3, SingleStorageClient, ObjectFile

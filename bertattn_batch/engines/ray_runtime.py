"""Ray itself for ``--engine ray``: imported on demand, connected to a cluster or a local runtime.

Usage::

    with ray_runtime(address=None, num_cpus=2) as ray:   # RAY_ADDRESS, or a local runtime on loopback
        ...
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import EngineError, Terminated

INSTALL_HINT = "pip install '.[ray]' in a checkout (or pip install 'ray[data]')"
#: On Linux, Ray binds a local runtime to the machine's outward address unless this is "0".
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: After this long joining a cluster, a line says so (Ray itself says nothing while it retries).
JOIN_WARN_SECONDS = 30.0

log = logging.getLogger(__name__)


def import_ray(local: bool = True) -> Any:
    """The ``ray`` module, or an EngineError that says how to install it."""
    if local:
        os.environ.setdefault(_LOOPBACK_ENV, "0")  # read when ray is first imported
    try:
        import ray
    except ImportError:
        raise EngineError(f"--engine ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


@contextlib.contextmanager
def ray_runtime(address: str | None = None, num_cpus: int | None = None, quiet: bool = True) -> Iterator[Any]:
    """Yield ``ray``, connected: to ``address`` (or RAY_ADDRESS), to the runtime this process already
    has, or to a new local one bound to loopback with no dashboard. A runtime started here stops on exit."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _check_reachable(address)
    # a cluster on this machine's loopback is joined there too: Ray would look for it at the outward
    # address, and retry that for a quarter of an hour
    ray = import_ray(local=address is None or _on_loopback(address))
    if ray.is_initialized():
        yield ray
        return
    level = logging.ERROR if quiet else logging.INFO
    handlers = _signal_handlers()
    slow = threading.Timer(
        JOIN_WARN_SECONDS,
        log.warning,
        (
            "%s",
            f"still joining the Ray cluster at {address}: "
            "Ray retries an address that answers but does not take it for many minutes; Ctrl-C stops it",
        ),
    )
    slow.daemon = True
    try:
        if address:
            slow.start()
            ray.init(address=address, log_to_driver=not quiet, logging_level=level)
        else:
            ray.init(
                address="local",
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                log_to_driver=not quiet,
                logging_level=level,
            )
    except (ConnectionError, RuntimeError, ValueError) as e:
        said = " ".join(str(e).split())[:600] or type(e).__name__  # Ray's advice runs over several lines
        if not address:
            raise EngineError(f"cannot start a local Ray runtime: {said}") from None
        raise EngineError(
            f"cannot join the Ray cluster at {address}: {said}; check the address, and for a "
            "cluster with token authentication set RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN)"
        ) from None
    except SystemExit as e:  # SIGTERM while Ray starts: its own handler, in place till ours are back, exits
        _stop_what_started(ray)
        if e.code == signal.SIGTERM:
            raise Terminated from None  # as the CLI's own handler says it: "interrupted", exit 143
        raise
    except KeyboardInterrupt:
        _stop_what_started(ray)
        raise
    finally:
        slow.cancel()
        for sig, handler in handlers.items():
            if handler is not None:  # even where Python still names it: Ray's is installed below it
                signal.signal(sig, handler)
    try:
        with _raylet_messages_logged(ray, quiet):
            yield ray
    finally:
        ray.shutdown()


@contextlib.contextmanager
def _raylet_messages_logged(ray: Any, quiet: bool) -> Iterator[None]:
    """Ray prints what the cluster pushes to the driver (each failure of a task and its retries, with
    whole tracebacks: some 140 lines for a model that cannot load) on stderr, whatever ``log_to_driver``
    says. Quiet, they go to this log's debug level (``--debug`` shows them); the error that ends the job
    is one line. Through Ray's internal printer, where this version of Ray has it."""
    module = getattr(getattr(ray, "_private", None), "worker", None)
    printer = getattr(module, "print_to_stdstream", None)
    if not quiet or printer is None:
        yield
        return

    def routed(data: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(data, dict) and data.get("pid") == "raylet":
            for line in data.get("lines") or ():
                log.debug("(raylet) %s", line)
        else:
            printer(data, *args, **kwargs)

    module.print_to_stdstream = routed
    try:
        yield
    finally:
        module.print_to_stdstream = printer


def _stop_what_started(ray: Any) -> None:
    """The processes of a runtime interrupted while it started (its agents lived on, orphaned)."""
    with contextlib.suppress(Exception):
        ray.shutdown()


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` or ``ray://host:port`` split; None for other forms (``auto``)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in host:
        return None
    return host.strip("[]"), int(port)


def _on_loopback(address: str) -> bool:
    where = _host_port(address)
    return where is not None and (where[0] == "localhost" or where[0].startswith("127.") or where[0] == "::1")


def _check_reachable(address: str) -> None:
    """Refuse a cluster address (``host:port`` or ``ray://host:port``) where nothing listens: ``ray.init``
    would retry it for minutes without a word. Other forms (``auto``) are left to Ray."""
    where = _host_port(address)
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=5).close()
    except OSError as e:
        raise EngineError(
            f"cannot join the Ray cluster at {address}: nothing answers there ({e.strerror or e}); check "
            "the address and that the cluster is up"
        ) from None


def _signal_handlers() -> dict[int, Any]:
    """This process's SIGTERM and SIGINT handlers, to put back after ``ray.init``: it replaces SIGTERM's
    with one that aborts (exit 134), where the CLI's commits the part in hand and exits 143."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

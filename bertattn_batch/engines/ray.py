"""The Ray engine (``--engine ray``): the same windows and parts, each encoded, scored, extracted and
staged by one of a pool of Ray actors (one GPU each where the cluster has GPUs), at most
``IN_FLIGHT_PER_WORKER`` windows each. Workers write their parts into the run directory themselves and
hand back only the manifest entry; the driver alone commits (docs/ray.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, NamedTuple

from .. import errors
from ..config import JobSpec
from ..errors import BertAttnError, EngineError, SpecError, Terminated, first_line
from ..extract import PassInfo, StagedPart, TableOptions, WindowJob, WindowRows
from ..run import PartWriter
from ..runtime import tune_runtime
from .scheduling import converted
from .start import load_classifier, located, run_header

log = logging.getLogger(__name__)

#: Windows each worker holds at once: one it scores and one queued, so it never waits for the driver.
IN_FLIGHT_PER_WORKER = 2
#: How often Ray restarts a worker process that died, and retries the window it held, before the run fails.
MAX_RETRIES = 3
#: Environment variables a worker needs to see as the driver does (offline hub, tokenizer threads).
_WORKER_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE")
INSTALL_HINT = "pip install '.[ray]' in a checkout (or pip install 'ray[data]')"
#: On Linux, Ray binds a local runtime to the machine's outward address unless this is "0".
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: After this long joining a cluster, a line says so (Ray itself says nothing while it retries).
JOIN_WARN_SECONDS = 30.0


class Placement(NamedTuple):
    """What each model worker asks Ray for, and the device it loads the model on."""

    cpus: int
    gpus: int
    device: str


def plan_placement(spec: JobSpec, cluster_cpus: float, node_cpus: float, cluster_gpus: float) -> Placement:
    """One GPU per worker where the cluster has GPUs (unless --device cpu); else a fair share of CPUs."""
    if spec.device.startswith("cuda:"):
        raise SpecError(
            f"with --engine ray every worker gets a GPU of its own: use --device cuda or auto, "
            f"not {spec.device}"
        )
    if spec.device in ("auto", "cuda") and cluster_gpus >= 1:
        return Placement(cpus=1, gpus=1, device="cuda")
    if spec.device == "cuda":
        raise SpecError("--device cuda asked for, but the Ray cluster has no GPUs; use --device auto or cpu")
    share = max(1, min(int(cluster_cpus) // spec.workers, int(node_cpus)))
    return Placement(cpus=share, gpus=0, device="cpu" if spec.device == "auto" else spec.device)


class WindowActor:
    """A Ray actor: loads the model once, then runs whole windows (``extract.WindowJob``)."""

    def __init__(self, spec: JobSpec, part_writer: PartWriter, pass_info: PassInfo, threads: int,
                 env: dict[str, str]) -> None:  # fmt: skip
        os.environ.update(env)
        import torch

        torch.set_num_threads(max(1, threads))
        clf = load_classifier(spec)
        budget = spec.batch_budget(clf.device_type)
        self.job = WindowJob(clf, *budget, part_writer, pass_info, options=TableOptions.of(spec, clf))

    def run(self, rows: WindowRows) -> StagedPart:
        return self.job(rows)


def _header_of(spec: JobSpec, worker_spec: JobSpec) -> dict[str, Any]:
    return run_header(spec, load_classifier(worker_spec))


class RayEngine:
    """Starts (or joins) Ray and a pool of :class:`WindowActor`; ``actor_cls`` may be replaced (tests)."""

    actor_cls: type[WindowActor] = WindowActor

    def __init__(self, spec: JobSpec) -> None:
        self.spec, self.timings, self._runtime = spec, {}, contextlib.ExitStack()

    def __enter__(self) -> RayEngine:
        spec = self.spec
        quiet = not logging.getLogger("bertattn_batch").isEnabledFor(logging.INFO)
        address = spec.ray_address or os.environ.get("RAY_ADDRESS") or None
        t0 = time.perf_counter()
        runtime = ray_runtime(address, num_cpus=max(os.cpu_count() or 1, spec.workers), quiet=quiet)
        ray = self.ray = self._runtime.enter_context(runtime)
        self.timings["ray_start"] = time.perf_counter() - t0
        try:
            res = ray.cluster_resources()
            node_cpus = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=1)
            self.place = plan_placement(spec, res.get("CPU", 1), node_cpus, res.get("GPU", 0))
            # the model by its absolute path: a worker on a cluster's node runs in the raylet's directory
            self.worker_spec = dataclasses.replace(  # (host_processes: warned of once, in spec)
                spec, model=located(spec.model), device=self.place.device, progress=False, host_processes=None
            )
            if self.place.gpus or address:  # the workers' device and files decide dtype and model hash
                task = ray.remote(_header_of).options(num_cpus=1, num_gpus=self.place.gpus)
                self._header = _ray_call(lambda: ray.get(task.remote(spec, self.worker_spec)))
            else:
                self._header = _header_of(spec, self.worker_spec)
        except BaseException:
            self._runtime.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._runtime.close()

    def header(self) -> dict[str, Any]:
        return self._header

    def describe(self) -> dict[str, Any]:
        return {"engine": "ray", "workers": self.spec.workers, "placement": self.place._asdict()}

    def executor(
        self, part_writer: PartWriter, pass_info: PassInfo, on_batch: Callable[[int], None]
    ) -> Actors:
        """A pool of :class:`WindowActor` for a pass."""
        place = self.place
        env = {k: os.environ[k] for k in _WORKER_ENV if k in os.environ} | tune_runtime()
        remote = self.ray.remote(self.actor_cls).options(
            num_cpus=place.cpus, num_gpus=place.gpus, max_restarts=MAX_RETRIES, max_task_retries=MAX_RETRIES
        )
        args = (self.worker_spec, part_writer, pass_info, place.cpus, env)
        actors = _ray_call(lambda: [remote.remote(*args) for _ in range(self.spec.workers)])
        return Actors(self.ray, actors, on_batch)


class Actors(contextlib.AbstractContextManager):
    """Windows sent to the least loaded of the actors, ``IN_FLIGHT_PER_WORKER`` each at most. What Ray
    raises comes back as the project's error (:func:`_as_ours`)."""

    def __init__(self, ray: Any, actors: list[Any], on_batch: Callable[[int], None]) -> None:
        self.ray, self._actors, self.on_batch = ray, actors, on_batch
        self.in_flight = IN_FLIGHT_PER_WORKER * len(actors)
        self._load = [0] * len(actors)
        self._lock = threading.Lock()

    def submit(self, rows: WindowRows) -> Future[StagedPart]:
        with self._lock:
            k = min(range(len(self._actors)), key=self._load.__getitem__)
            self._load[k] += 1
        future = converted(_ray_call(lambda: self._actors[k].run.remote(rows)).future(), _as_ours)
        future.add_done_callback(lambda f: self._done(k, f))
        return future

    def _done(self, k: int, future: Future[StagedPart]) -> None:
        with self._lock:
            self._load[k] -= 1
        if not future.cancelled() and future.exception() is None:
            self.on_batch(future.result().stats.scored)

    def __exit__(self, *exc: object) -> None:
        """The actors end, and with them their CPUs or GPUs are free for the next run."""
        for actor in self._actors:
            self.ray.kill(actor)


def _ray_call(fn: Callable[[], Any]) -> Any:
    """Run ``fn``; an error a Ray worker raised comes back as one line (see :func:`_as_ours`)."""
    try:
        return fn()
    except Exception as e:
        raise _as_ours(e) from None


def _as_ours(e: BaseException) -> BaseException:
    """The project's own error where a worker raised one (a model out of memory, a bad input), else an
    EngineError that names the worker's error; the driver's own errors as they are."""
    if type(e).__module__ == errors.__name__:
        return e  # raised here, not a Ray wrapper of a worker's error
    log.info("a Ray worker failed:\n%s", e)
    root = e
    while isinstance(getattr(root, "cause", None), BaseException):  # RayTaskError.cause
        root = root.cause
    if isinstance(root, BertAttnError):
        return root
    return EngineError(
        f"the Ray run failed: {type(root).__name__}: {first_line(root)} (rerun to resume; --debug shows more)"
    )


# -- Ray itself: imported on demand, connected to a cluster or a local runtime --------------------------
@contextlib.contextmanager
def ray_runtime(address: str | None = None, num_cpus: int | None = None, quiet: bool = True) -> Iterator[Any]:
    """Yield ``ray``, connected: to ``address`` (or RAY_ADDRESS), to the runtime this process already
    has, or to a new local one bound to loopback with no dashboard. A runtime started here stops on exit."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    # host:port or ray://host:port; other forms (auto) are left to Ray
    host, sep, port = (address or "").removeprefix("ray://").rpartition(":")
    where = (host.strip("[]"), int(port)) if sep and port.isdigit() and host and "/" not in host else None
    if where is not None:  # where nothing listens, ray.init would retry for minutes without a word
        try:
            socket.create_connection(where, timeout=5).close()
        except OSError as e:
            raise EngineError(
                f"cannot join the Ray cluster at {address}: nothing answers there ({e.strerror or e}); "
                "check the address and that the cluster is up"
            ) from None
    # a cluster on this machine's loopback is joined there too: Ray would look for it at the outward
    # address, and retry that for a quarter of an hour
    on_loopback = where is not None and (where[0] in ("localhost", "::1") or where[0].startswith("127."))
    if address is None or on_loopback:
        os.environ.setdefault(_LOOPBACK_ENV, "0")  # read when ray is first imported
    try:
        import ray
    except ImportError:
        raise EngineError(f"--engine ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    if ray.is_initialized():
        yield ray
        return
    level = logging.ERROR if quiet else logging.INFO
    # ray.init replaces SIGTERM's handler with one that aborts (exit 134): ours are put back after it
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    slow = threading.Timer(JOIN_WARN_SECONDS, log.warning, (
        "still joining the Ray cluster at %s: Ray retries an address that answers but does not take it "
        "for many minutes; Ctrl-C stops it", address))  # fmt: skip
    slow.daemon = True
    try:
        if address:
            slow.start()
            ray.init(address=address, log_to_driver=not quiet, logging_level=level)
        else:
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                     _node_ip_address="127.0.0.1", log_to_driver=not quiet, logging_level=level)  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as e:
        said = " ".join(str(e).split())[:600] or type(e).__name__  # Ray's advice runs over several lines
        if not address:
            raise EngineError(f"cannot start a local Ray runtime: {said}") from None
        raise EngineError(
            f"cannot join the Ray cluster at {address}: {said}; check the address, and for a "
            "cluster with token authentication set RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN)"
        ) from None
    except (SystemExit, KeyboardInterrupt) as e:  # SIGTERM while Ray starts: its own handler exits
        with contextlib.suppress(Exception):  # the agents it started would live on, orphaned
            ray.shutdown()
        if isinstance(e, SystemExit) and e.code == signal.SIGTERM:
            raise Terminated from None  # as the CLI's own handler says it: "interrupted", exit 143
        raise
    finally:
        slow.cancel()
        for sig, handler in handlers.items():
            if handler is not None:  # even where Python still names it: Ray's is installed below it
                signal.signal(sig, handler)
    try:
        yield ray
    finally:
        ray.shutdown()

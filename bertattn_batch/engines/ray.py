"""The Ray engine (``--engine ray``): the same windows and parts, scored by a pool of Ray actors.

Usage::

    bertattn extract reviews/ --model models/zh-senti --out runs/r1 --engine ray --workers 4
    bertattn run jobs/default.toml --engine ray --ray-address ray://head:10001   # or RAY_ADDRESS=...

    driver: read + number the rows, cut the windows (the one rule, extract/windows.py)
       ──▶ an actor per worker (one GPU each where the cluster has GPUs): encode, score, extract and
           stage the window's part (extract/job.py), at most ``IN_FLIGHT_PER_WORKER`` windows each
       ──▶ the driver commits the parts in row order (``run_job``)

The driver streams: Ray's object store holds only the windows in flight, never the corpus. A window's
part is named by its first row, so when a worker dies Ray restarts it and retries the window, and the
retry rewrites the same files. Workers write their parts into the run directory themselves (under
temporary names on a filesystem every node mounts; under their final names on an object store,
run/stored.py) and hand back only the manifest entry; the driver alone writes the manifest.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from .. import errors
from ..config import JobSpec
from ..errors import BertAttnError, EngineError, SpecError, first_line
from ..extract import PassInfo, StagedPart, WindowJob, WindowRows
from ..run import PartWriter
from ..runtime import tune_runtime
from .ray_runtime import ray_runtime
from .scheduling import converted
from .start import load_classifier, located, run_header

log = logging.getLogger(__name__)

#: Windows each worker holds at once: one it scores and one queued, so it never waits for the driver.
IN_FLIGHT_PER_WORKER = 2
#: How often Ray restarts a worker process that died, and retries the window it held, before the run fails.
MAX_RETRIES = 3
#: Environment variables a worker needs to see as the driver does (offline hub, tokenizer threads).
_WORKER_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE")


@dataclass(frozen=True)
class Placement:
    """What each model worker asks Ray for, and the device it loads the model on."""

    cpus: int
    gpus: int
    device: str


def plan_placement(spec: JobSpec, cluster_cpus: float, node_cpus: float, cluster_gpus: float) -> Placement:
    """One GPU per worker where the cluster has GPUs (unless --device cpu); else a fair share of CPUs."""
    if spec.device.startswith("cuda:"):
        raise SpecError(
            f"with --engine ray every worker gets a GPU of its own: use --device cuda or auto, not {spec.device}"
        )
    if spec.device in ("auto", "cuda") and cluster_gpus >= 1:
        return Placement(cpus=1, gpus=1, device="cuda")
    if spec.device == "cuda":
        raise SpecError("--device cuda asked for, but the Ray cluster has no GPUs; use --device auto or cpu")
    share = max(1, min(int(cluster_cpus) // spec.workers, int(node_cpus)))
    return Placement(cpus=share, gpus=0, device="cpu" if spec.device == "auto" else spec.device)


def _cluster_shape(ray: Any) -> tuple[float, float, float]:
    res = ray.cluster_resources()
    node_cpus = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=1)
    return res.get("CPU", 1), node_cpus, res.get("GPU", 0)


class WindowActor:
    """A Ray actor: loads the model once, then runs whole windows (``extract.WindowJob``)."""

    def __init__(
        self,
        spec: JobSpec,
        part_writer: PartWriter,
        pass_info: PassInfo,
        threads: int,
        env: dict[str, str],
    ) -> None:
        os.environ.update(env)
        import torch

        torch.set_num_threads(max(1, threads))
        clf = load_classifier(spec)
        batch_tokens, max_batch_size = spec.batch_budget(clf.device_type)
        self.job = WindowJob(
            clf, batch_tokens, max_batch_size, part_writer, pass_info, store_text=spec.store_text
        )

    def run(self, rows: WindowRows) -> StagedPart:
        return self.job(rows)


def _header_of(spec: JobSpec, worker_spec: JobSpec) -> dict[str, Any]:
    return run_header(spec, load_classifier(worker_spec))


class RayEngine:
    """Starts (or joins) Ray and a pool of :class:`WindowActor`; ``actor_cls`` may be replaced (tests)."""

    actor_cls: type[WindowActor] = WindowActor

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.timings: dict[str, float] = {}
        self._runtime: Any = None

    def __enter__(self) -> RayEngine:
        spec = self.spec
        quiet = not logging.getLogger("bertattn_batch").isEnabledFor(logging.INFO)
        address = spec.ray_address or os.environ.get("RAY_ADDRESS") or None
        t0 = time.perf_counter()
        self._runtime = ray_runtime(address, num_cpus=max(os.cpu_count() or 1, spec.workers), quiet=quiet)
        ray = self.ray = self._runtime.__enter__()
        self.timings["ray_start"] = time.perf_counter() - t0
        try:
            self.place = plan_placement(spec, *_cluster_shape(ray))
            # the model by its absolute path: a worker on a cluster's node runs in the raylet's directory
            model = located(spec.model)
            self.worker_spec = dataclasses.replace(  # (host_processes: warned of once, in spec)
                spec, model=model, device=self.place.device, progress=False, host_processes=None
            )
            if self.place.gpus or address:  # the workers' device and files decide dtype and model hash
                task = ray.remote(_header_of).options(num_cpus=1, num_gpus=self.place.gpus)
                self._header = _ray_call(lambda: ray.get(task.remote(spec, self.worker_spec)))
            else:
                self._header = _header_of(spec, self.worker_spec)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runtime is not None:
            self._runtime.__exit__(None, None, None)
            self._runtime = None

    def header(self) -> dict[str, Any]:
        return self._header

    def describe(self) -> dict[str, Any]:
        return {"engine": "ray", "workers": self.spec.workers, "placement": dataclasses.asdict(self.place)}

    def executor(
        self, part_writer: PartWriter, pass_info: PassInfo, on_batch: Callable[[int], None]
    ) -> Actors:
        """A pool of :class:`WindowActor` for a pass. What Ray raises comes back as the project's error
        (:func:`_as_ours`); the driver's own errors (reading the inputs) pass through as they are."""
        ray, place = self.ray, self.place
        env = {k: os.environ[k] for k in _WORKER_ENV if k in os.environ} | tune_runtime()
        remote = ray.remote(self.actor_cls).options(
            num_cpus=place.cpus, num_gpus=place.gpus, max_restarts=MAX_RETRIES, max_task_retries=MAX_RETRIES
        )
        actors = _ray_call(
            lambda: [
                remote.remote(self.worker_spec, part_writer, pass_info, place.cpus, env)
                for _ in range(self.spec.workers)
            ]
        )
        return Actors(ray, actors, on_batch, self.timings)


class Actors:
    """Windows sent to the least loaded of the actors, ``IN_FLIGHT_PER_WORKER`` each at most."""

    def __init__(self, ray: Any, actors: list[Any], on_batch: Callable[[int], None], timings: dict) -> None:
        self.ray, self._actors, self.on_batch, self.timings = ray, actors, on_batch, timings
        self.in_flight = IN_FLIGHT_PER_WORKER * len(actors)
        self._load = [0] * len(actors)
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()

    def submit(self, rows: WindowRows) -> Future[StagedPart]:
        with self._lock:
            k = min(range(len(self._actors)), key=self._load.__getitem__)
            self._load[k] += 1
        ref = _ray_call(lambda: self._actors[k].run.remote(rows))
        future = converted(ref.future(), _as_ours)
        future.add_done_callback(lambda f: self._done(k, f))
        return future

    def _done(self, k: int, future: Future[StagedPart]) -> None:
        with self._lock:
            self._load[k] -= 1
        self.timings.setdefault("first_result", time.perf_counter() - self._t0)
        if not future.cancelled() and future.exception() is None:
            self.on_batch(future.result().stats.scored)

    def __enter__(self) -> Actors:
        return self

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

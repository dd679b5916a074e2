"""The Ray engine (``--engine ray``): the same windows and parts, scored by a pool of Ray actors.

Usage::

    bertattn extract reviews/ --model models/zh-senti --out runs/r1 --engine ray --workers 4
    bertattn run jobs/default.toml --engine ray --ray-address ray://head:10001   # or RAY_ADDRESS=...

    driver: read + number the rows, cut the windows (the one rule, extract/windows.py), in a thread
       ──▶ an actor per worker (one GPU each where the cluster has GPUs): encode, score, extract and
           stage the window's part (extract/job.py), at most ``IN_FLIGHT_PER_WORKER`` windows each
       ──▶ the driver commits each part once every part before it is committed

The driver streams: the first windows are scored while later ones are still being read, and Ray's
object store holds only the windows in flight, never the corpus. A window's part is named by its
first row, so when a worker dies Ray restarts it and retries the window, and the retry rewrites the
same files instead of adding new ones. Workers write their parts into the run directory themselves
(under temporary names on a filesystem every node mounts; under their final names on an object store,
run/stored.py) and hand back only the manifest entry; the driver alone writes the manifest.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import errors
from ..config import JobSpec
from ..errors import BertAttnError, EngineError, SpecError
from ..extract import PassInfo, StagedPart, WindowJob, WindowRows
from ..run import PartWriter
from ..runtime import tune_runtime
from .ray_runtime import ray_runtime, worker_error
from .start import load_classifier, located, run_header
from .threads import prefetch

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
        self._actors = []
        gc.collect()  # the failed run's frames hold its actors, and their CPUs or GPUs, until collected
        if self._runtime is not None:
            self._runtime.__exit__(None, None, None)
            self._runtime = None

    def header(self) -> dict[str, Any]:
        return self._header

    def describe(self) -> dict[str, Any]:
        return {"engine": "ray", "workers": self.spec.workers, "placement": dataclasses.asdict(self.place)}

    def parts(
        self,
        windows: Iterator[WindowRows],
        part_writer: PartWriter,
        pass_info: PassInfo,
        on_batch: Callable[[int], None] | None = None,
    ) -> Iterator[StagedPart]:
        """Keep every actor fed, and hand the parts back in the order of their windows. What Ray raises
        comes back as the project's error (:func:`_as_ours`); the driver's own errors (reading the
        inputs, committing parts) pass through as they are, as with every other engine."""
        try:
            yield from self._parts(windows, part_writer, pass_info, on_batch)
        finally:
            self._actors = []

    def _parts(
        self,
        windows: Iterator[WindowRows],
        part_writer: PartWriter,
        pass_info: PassInfo,
        on_batch: Callable[[int], None] | None,
    ) -> Iterator[StagedPart]:
        ray, place = self.ray, self.place
        env = {k: os.environ[k] for k in _WORKER_ENV if k in os.environ} | tune_runtime()
        remote = ray.remote(self.actor_cls).options(
            num_cpus=place.cpus, num_gpus=place.gpus, max_restarts=MAX_RETRIES, max_task_retries=MAX_RETRIES
        )
        self._actors = _ray_call(
            lambda: [
                remote.remote(self.worker_spec, part_writer, pass_info, place.cpus, env)
                for _ in range(self.spec.workers)
            ]
        )
        load = dict.fromkeys(range(len(self._actors)), 0)  # windows in flight per actor
        in_flight: dict[Any, tuple[int, int]] = {}  # ref -> (window number, actor)
        finished: dict[int, StagedPart] = {}
        failed: dict[int, Exception] = {}  # window number -> its worker's error
        order = {"sent": 0, "given": 0}
        t0 = time.perf_counter()

        def in_order() -> Iterator[StagedPart]:
            """Collect one result, then hand back every part whose windows before it are all back."""
            ready, _ = _ray_call(lambda: ray.wait(list(in_flight), num_returns=1))
            for ref in ready:
                number, actor = in_flight.pop(ref)
                load[actor] -= 1
                try:
                    finished[number] = ray.get(ref)
                except Exception as e:
                    failed[number] = e
                self.timings.setdefault("first_result", time.perf_counter() - t0)
            while order["given"] in finished:
                part = finished.pop(order["given"])
                order["given"] += 1
                if on_batch is not None:
                    on_batch(part.stats.scored)
                yield part

        for window in prefetch(windows, depth=2):  # the driver reads ahead in a thread
            while len(in_flight) >= IN_FLIGHT_PER_WORKER * len(self._actors) and not failed:
                yield from in_order()
            if failed:
                break
            actor = min(load, key=load.__getitem__)
            ref = _ray_call(lambda a=self._actors[actor], w=window: a.run.remote(w))
            in_flight[ref] = (order["sent"], actor)
            load[actor] += 1
            order["sent"] += 1
        # after a failure, the windows before it are still waited for and handed back: finished work is
        # committed, and the rerun resumes from the failed window
        while in_flight and not (failed and min(n for n, _ in in_flight.values()) > min(failed)):
            yield from in_order()
        if failed:
            raise _as_ours(failed[min(failed)]) from None


def _ray_call(fn: Callable[[], Any]) -> Any:
    """Run ``fn``; an error a Ray worker raised comes back as one line (see :func:`_as_ours`)."""
    try:
        return fn()
    except Exception as e:
        raise _as_ours(e) from None


def _as_ours(e: Exception) -> Exception:
    """The project's own error class where a worker raised one (a model that runs out of memory, a bad
    input), else an EngineError that names the worker's error."""
    if isinstance(e, BertAttnError) and type(e).__module__ == errors.__name__:
        return e  # raised here, not a Ray wrapper of a worker's error
    cause = getattr(e, "cause", None)  # a Ray task's or actor's own exception, where it could be sent
    if isinstance(cause, BertAttnError) and type(cause).__module__ == errors.__name__:
        log.info("a Ray worker failed:\n%s", e)
        return type(cause)(str(cause))
    qualname, message = worker_error(e)
    log.info("a Ray worker failed:\n%s", e)
    module, _, name = qualname.rpartition(".")
    cls = getattr(errors, name, None) if module == errors.__name__ else None
    if isinstance(cls, type) and issubclass(cls, BertAttnError):
        return cls(message)
    return EngineError(f"the Ray run failed: {name}: {message} (rerun to resume; --debug shows more)")

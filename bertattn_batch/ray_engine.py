"""The extraction job on Ray Data (``--engine ray``): one machine or a cluster, the same run directory.

Usage::

    bertattn extract reviews/ --model models/zh-senti --out runs/r1 --engine ray --workers 4
    bertattn run jobs/default.toml --engine ray --ray-address ray://head:10001   # or RAY_ADDRESS=...

    from bertattn_batch.ray_engine import run_job_ray
    summary = run_job_ray(spec)        # what run_job(spec) does when spec.engine == "ray"

    read (Ray Data, or the local readers in a task per file) ──▶ row numbers, ids, windows of
       consecutive rows (driver + small tasks)
       ──▶ map_batches(WindowStage): encode, model, extract, write the part (an actor pool, one GPU each)
       ──▶ the driver records each part in the manifest, in row order

The stages are the local engine's own (``_encode_block``, ``ModelStage``, ``Extractor``,
``RunWriter.stage_part``): only where they run differs. A window's parts are named by its first row,
so when a worker dies Ray retries the window and the retry rewrites the same files instead of adding
new ones. Workers write their parts into the run directory themselves, under temporary names (on a
cluster it must be a filesystem every node mounts), and hand back only the manifest entry. The
driver alone writes the manifest: it records parts in row order and only then gives their files
their final names, so a ``part-*`` file is always a committed one, and an interrupted run resumes
like a local one (temporary files of parts never recorded are removed when the run is reopened).

The read phase (``ray_read``) holds the selected columns in Ray's object store (spilled to disk
when larger than memory) before the model stage starts: row numbers are global, so every block's
size must be known before the first window is cut.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from . import errors
from .encode import Encoder
from .errors import BertAttnError, EngineError, SpecError, first_line
from .extract import Extractor, vocab_array
from .heap import trim_heap
from .pipeline import (
    ModelStage,
    RunSummary,
    _count,
    _encode_block,
    _human_bytes,
    _totals,
    ensure_model,
    load_classifier,
    resume_point,
    run_header,
)
from .ray_read import ROW_FIELDS, WindowPlan, plan_windows, split_windows, worker_error
from .read import RowBatch, check_inputs, source_files
from .spec import JobSpec
from .write import RunWriter

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'bertattn-batch[ray]' (or pip install 'ray[data]')"
#: On Linux, Ray binds a local runtime to the machine's outward address unless this is "0".
_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: Environment variables a worker needs to see as the driver does (offline hub, tokenizer threads).
_WORKER_ENV = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "HF_HUB_CACHE",
    "TOKENIZERS_PARALLELISM",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY",  # the kernel caches the package caps on import (__init__.py)
    "LRU_CACHE_CAPACITY",
)


# -- Ray itself ---------------------------------------------------------------------------------------
def import_ray(local: bool = True) -> Any:
    """The ``ray`` module, or an EngineError that says how to install it."""
    if local:
        os.environ.setdefault(_LOOPBACK_ENV, "0")  # read when ray is first imported
    try:
        import ray
        import ray.data
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
    ray = import_ray(local=address is None)
    if ray.is_initialized():
        yield ray
        return
    level = logging.ERROR if quiet else logging.INFO
    handlers = _signal_handlers()
    try:
        if address:
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
        if not address:
            raise EngineError(f"cannot start a local Ray runtime: {first_line(e)}") from None
        raise EngineError(
            f"cannot join the Ray cluster at {address}: {first_line(e)}; check the address, and for a "
            "cluster with token authentication set RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN)"
        ) from None
    finally:
        _restore(handlers)
    try:
        yield ray
    finally:
        ray.shutdown()


def _check_reachable(address: str) -> None:
    """Refuse a cluster address (``host:port`` or ``ray://host:port``) where nothing listens: ``ray.init``
    would retry it for minutes without a word. Other forms (``auto``) are left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host or "/" in host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise EngineError(
            f"cannot join the Ray cluster at {address}: nothing answers there ({e.strerror or e}); check "
            "the address and that the cluster is up"
        ) from None


def _signal_handlers() -> dict[int, Any]:
    """This process's SIGTERM and SIGINT handlers: ``ray.init`` replaces SIGTERM's with one that dumps
    a native stack and aborts (exit 134), where the CLI commits the part in hand and exits 143."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore(handlers: dict[int, Any]) -> None:
    for sig, handler in handlers.items():
        if handler is not None:  # even where Python still names it: Ray's is installed below Python's
            signal.signal(sig, handler)


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


@contextlib.contextmanager
def _data_context(ray: Any, quiet: bool) -> Iterator[None]:
    """Ray Data settings for this job, restored afterwards (datasets copy them when they are made)."""
    ctx = ray.data.DataContext.get_current()
    settings = {
        "preserve_order": True,  # row numbers come from the order blocks are read in
        "enable_progress_bars": not quiet,  # the job shows its own bar
    }
    if hasattr(ctx, "use_datasource_v2"):
        # The V2 Parquet reader starts 32 footer-reading actors per read: seconds of start-up on a
        # small machine for nothing on a few files. V1 reads footers in its read tasks.
        settings["use_datasource_v2"] = False
    saved = {k: getattr(ctx.execution_options if k == "preserve_order" else ctx, k) for k in settings}
    level = logging.getLogger("ray.data").level
    for k, v in settings.items():
        setattr(ctx.execution_options if k == "preserve_order" else ctx, k, v)
    if quiet:
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)  # its errors come back as ours
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(ctx.execution_options if k == "preserve_order" else ctx, k, v)
        logging.getLogger("ray.data").setLevel(level)


# -- the model stage: a callable class for map_batches ------------------------------------------------
class WindowStage:
    """Loads the model once per worker; each call encodes, scores, extracts and writes whole windows."""

    def __init__(
        self, spec: JobSpec, run_dir: str, generation: int, threads: int, env: dict[str, str]
    ) -> None:
        os.environ.update(env)
        import torch

        torch.set_num_threads(max(1, threads))
        self.clf = load_classifier(spec)
        self.stage = ModelStage(self.clf, spec.batch_tokens, spec.max_batch_size)
        self.encode = Encoder(self.clf.tokenizer, self.clf.max_length)
        self.extractor = Extractor(
            vocab_array(self.clf.tokenizer), self.clf.layers, self.clf.num_heads, self.clf.labels
        )
        self.writer = RunWriter(run_dir, header={})  # never opened: the driver owns the manifest
        self.generation = generation

    def __call__(self, batch: pa.Table) -> pa.Table:
        done = [self.process(window) for window in split_windows(batch)]
        return pa.table(
            {
                "entry": [json.dumps(entry) for entry, _ in done],
                "summary": [json.dumps(summary) for _, summary in done],
            }
        )

    def process(self, table: pa.Table) -> tuple[dict[str, Any], dict[str, Any]]:
        """Write one window's parts under their temporary names; return the manifest entry and counts."""
        t0 = time.perf_counter()
        rows = RowBatch(**{name: table.column(name).to_pylist() for name in ROW_FIELDS})
        window = _encode_block(rows, self.encode, 0, None, None)
        assert window is not None and window.start_row == rows.row_index[0]
        t1 = time.perf_counter()
        real, slots = self.stage(window)
        t2 = time.perf_counter()
        tables = self.extractor.tables(window.rows)
        t3 = time.perf_counter()
        entry = self.writer.stage_part(window.start_row, window.end_row, tables, self.generation)
        part = RunSummary(run_dir="")
        _count(part, window, real, slots)
        part.seconds = {"read_encode": t1 - t0, "model": t2 - t1, "extract": t3 - t2}
        part.seconds["write"] = time.perf_counter() - t3
        trim_heap()
        return entry, dict(part.__dict__)


def _merge(summary: RunSummary, part: dict[str, Any], timings: Counter) -> None:
    for name in ("input_rows", "scored", "tokens", "padded_slots", "truncated"):
        setattr(summary, name, getattr(summary, name) + part[name])
    for status, n in part["status_counts"].items():
        summary.status_counts[status] = summary.status_counts.get(status, 0) + n
    timings.update(part["seconds"])


def _worker_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in _WORKER_ENV if k in os.environ}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _header_of(spec: JobSpec, worker_spec: JobSpec) -> dict[str, Any]:
    return run_header(spec, load_classifier(worker_spec))


# -- the job ------------------------------------------------------------------------------------------
def run_job_ray(
    spec: JobSpec,
    progress: bool | None = None,
    writer_cls: type[RunWriter] = RunWriter,
    stage_cls: type[WindowStage] = WindowStage,
) -> RunSummary:
    """Run one extraction job on Ray; same run directory, summary and manifest as ``run_job``."""
    show = spec.progress if progress is None else progress
    quiet = not logging.getLogger("bertattn_batch").isEnabledFor(logging.INFO)
    t_start = time.perf_counter()
    # a mistyped path or column fails here, before a model loads or a cluster starts
    sources = check_inputs(
        spec.inputs, spec.text_col, spec.id_col, spec.label_col, spec.input_format, spec.out
    )
    timings: Counter = Counter()
    if trained := ensure_model(spec, progress=show):
        timings["train"] = trained
    address = spec.ray_address or os.environ.get("RAY_ADDRESS") or None
    cpus = max(os.cpu_count() or 1, spec.workers)
    t0 = time.perf_counter()
    with ray_runtime(address, num_cpus=cpus, quiet=quiet) as ray, _data_context(ray, quiet):
        timings["ray_start"] = time.perf_counter() - t0
        place = plan_placement(spec, *_cluster_shape(ray))
        worker_spec = dataclasses.replace(spec, device=place.device, progress=False)
        if place.gpus or address:  # the workers' device and files decide dtype and model hash
            header_task = ray.remote(_header_of).options(num_cpus=1, num_gpus=place.gpus)
            header = _ray_call(ray, lambda: ray.get(header_task.remote(spec, worker_spec)))
        else:
            header = _header_of(spec, worker_spec)
        summary = RunSummary(run_dir=str(spec.out))
        incremental = spec.on_existing == "incremental"
        on_existing = "resume" if incremental else spec.on_existing
        with writer_cls(spec.out, header, on_existing=on_existing) as sink:
            by_id = spec.id_col is not None
            generation, skip_until, skip_ids, taken = resume_point(
                sink, incremental, by_id, source_files(sources)
            )
            summary.skipped_committed = skip_until + len(skip_ids or ())
            t0 = time.perf_counter()
            windows, _ = _ray_call(ray, lambda: plan_windows(ray, spec, sources, skip_until, skip_ids, taken))
            timings["read_plan"] = time.perf_counter() - t0
            if windows:
                kwargs = dict(
                    spec=worker_spec,
                    run_dir=str(spec.out),
                    generation=generation,
                    threads=place.cpus,
                    env=_worker_env(),
                )
                _ray_call(
                    ray,
                    lambda: _score_windows(
                        ray, windows, stage_cls, kwargs, place, spec, sink, summary, timings, show
                    ),
                )
            summary.seconds = {k: round(v, 3) for k, v in timings.items()}
            summary.seconds["wall"] = round(time.perf_counter() - t_start, 3)
            last_run = {
                **summary.as_dict(),
                "engine": "ray",
                "workers": spec.workers,
                "placement": dataclasses.asdict(place),
            }
            sink.finalize({"last_run": last_run, "counts": _totals(sink)})
    log.info("ray engine: %s written; %s", _human_bytes(summary.bytes_written), summary.seconds)
    return summary


def _score_windows(
    ray: Any,
    windows: list[WindowPlan],
    stage_cls: type[WindowStage],
    kwargs: dict[str, Any],
    place: Placement,
    spec: JobSpec,
    sink: RunWriter,
    summary: RunSummary,
    timings: Counter,
    show: bool,
) -> None:
    """Run the actor pool over the windows; record each part once every part before it is recorded."""
    from tqdm.auto import tqdm

    ds = ray.data.from_arrow_refs([w.ref for w in windows]).map_batches(
        stage_cls,
        batch_size=None,  # one block, that is one window, per call
        batch_format="pyarrow",
        fn_constructor_kwargs=kwargs,
        # A fixed pool; Ray Data restarts a dead actor and retries the window it held (its default).
        concurrency=min(spec.workers, len(windows)),
        num_cpus=place.cpus,
        num_gpus=place.gpus,
    )
    order = [w.start for w in windows]
    arrived: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    bar = tqdm(total=sum(w.rows for w in windows), unit="review", disable=not show, dynamic_ncols=True)
    recorded = 0
    t0 = time.perf_counter()
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            timings["first_result"] = timings["first_result"] or time.perf_counter() - t0
            for entry, part in zip(
                batch.column("entry").to_pylist(), batch.column("summary").to_pylist(), strict=True
            ):
                entry = json.loads(entry)
                arrived[entry["start_row"]] = (entry, json.loads(part))
            while recorded < len(order) and order[recorded] in arrived:
                entry, part = arrived.pop(order[recorded])
                sink.record_part(entry)  # the commit point, then the final names, as the local engine does
                sink.publish_part(entry)
                _merge(summary, part, timings)
                summary.bytes_written += entry["bytes"]
                summary.parts_written += 1
                bar.update(part["input_rows"])
                recorded += 1
    finally:
        bar.close()
    if recorded < len(order):
        missing = [s for s in order[recorded:] if s not in arrived][:5]
        raise EngineError(
            f"Ray returned no result for the windows starting at rows {missing}; rerun to resume"
        )


def _ray_call(ray: Any, fn: Any) -> Any:
    """Run ``fn``; an error a Ray worker raised comes back as one line, as the project's own error
    class where it was one (a model that runs out of memory, a bad input)."""
    try:
        return fn()
    except Exception as e:
        if isinstance(e, BertAttnError) and type(e).__module__ == errors.__name__:
            raise  # raised here, not a Ray wrapper of a worker's error
        qualname, message = worker_error(e)
        log.info("a Ray worker failed:\n%s", e)
    gc.collect()  # the failed run's frames hold its actors, and their CPUs or GPUs, until collected
    module, _, name = qualname.rpartition(".")
    cls = getattr(errors, name, None) if module == errors.__name__ else None
    if isinstance(cls, type) and issubclass(cls, BertAttnError):
        raise cls(message) from None
    raise EngineError(
        f"the Ray run failed: {name}: {message} (rerun to resume; --debug shows more)"
    ) from None

"""Every Prometheus series a train or eval pod exports, on the registry of the pod that exports it.

No I/O. Series observed where the event happens (a publish, a fetch) are module-level metric
objects; figures that already live in a component (the coordinator's progress, an eval worker's
counters) are read at scrape time by a :class:`Bound` collector, so nothing is counted twice.
A collector yields its families (zero-valued) before it is bound, so ``/metrics`` always lists
the same series, and :func:`series_names` can be checked against the dashboard.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

#: Train rank 0 only: the run's progress and the trajectory plane (the coordinator lives there).
RANK_ZERO = CollectorRegistry(auto_describe=True)
#: Every train rank: publishing and serving weight versions.
TRAIN = CollectorRegistry(auto_describe=True)
#: Eval workers: the loaded version, rollouts, and the node receiver's fetches.
EVAL = CollectorRegistry(auto_describe=True)

#: Seconds; from a sub-millisecond local publish of a small model to a 1 GB fetch.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Weight-version lag of trained fragments (async: bounded by train.maxStaleness).
LAG_BUCKETS = (0, 1, 2, 3, 4, 8, 16, 32)

# --- every train rank: the weight plane's write side --------------------------------------------
PUBLISH_SECONDS = Histogram(
    "rlkube_weights_publish_seconds",
    "Time of one publish, from send() to the stage: committed (this node's readers have it) or "
    "announced (checksummed; remote receivers may fetch it).",
    ["stage"],
    buckets=LATENCY_BUCKETS,
    registry=TRAIN,
)
PUBLISHED_BYTES = Counter(
    "rlkube_weights_published_bytes", "Bytes written into this node's weight buffer.", registry=TRAIN
)
FETCH_SERVED_SECONDS = Histogram(
    "rlkube_weights_fetch_served_seconds",
    "Time to stream one fetch (a version or a range of it) to a remote receiver.",
    buckets=LATENCY_BUCKETS,
    registry=TRAIN,
)
SERVED_BYTES = Counter(
    "rlkube_weights_served_bytes", "Weight bytes streamed to remote receivers.", registry=TRAIN
)
DATA_PORT_SERVING = Gauge(
    "rlkube_weights_data_port_serving",
    "1 while this rank serves its weight data port; 0 when remote receivers fetch its bytes over "
    "gRPC (transport grpc, or the port could not be bound: the rank's log says why).",
    registry=TRAIN,
)

# --- eval workers: the node receiver and loads from the stream --------------------------------
FETCH_SECONDS = Histogram(
    "rlkube_weights_fetch_seconds",
    "Time to fetch and verify one version (node receiver over the weight data port or gRPC, or a load "
    "from the stream).",
    buckets=LATENCY_BUCKETS,
    registry=EVAL,
)
FETCHED_BYTES = Counter(
    "rlkube_weights_fetched_bytes", "Weight bytes received over the network.", registry=EVAL
)
DATA_PORT_FALLBACKS = Counter(
    "rlkube_weights_data_port_fallbacks",
    "Times a train rank's weight data port could not be reached and its bytes were fetched over gRPC.",
    registry=EVAL,
)
RESTARTS = Gauge(
    "rlkube_eval_restarts",
    "Times this eval pod's process started again (counted in its weight directory, which "
    "outlives the container).",
    registry=EVAL,
)


@dataclass(frozen=True)
class RankZeroFigures:
    """What train rank 0 knows about the run, read from its coordinator at scrape time."""

    epoch: int = 0
    max_epochs: int = 0
    env_steps: int = 0
    steps_per_second: float = 0.0
    weight_version: int = 0
    mean_return: float | None = None
    eval_workers: int = 0
    finished: bool = False
    fragments_in_flight: int = 0
    fragments_acknowledged: int = 0
    fragments_dropped_stale: int = 0
    duplicate_pushes: int = 0
    fragments_refused: int = 0
    fragments_quarantined: int = 0
    eval_pods_evicted: int = 0
    #: lag -> trained fragments with that lag
    lag_counts: Mapping[int, int] = field(default_factory=dict)
    #: node -> versions behind the published one
    node_lag: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class EvalFigures:
    """What an eval worker knows about itself, read at scrape time."""

    loaded_version: int = 0
    env_steps: int = 0
    fragments: int = 0
    rollout_seconds: float = 0.0
    weight_wait_seconds: float = 0.0

    @property
    def weight_wait_share(self) -> float:
        busy = self.rollout_seconds + self.weight_wait_seconds
        return self.weight_wait_seconds / busy if busy > 0 else 0.0

    @property
    def rollout_steps_per_second(self) -> float:
        return self.env_steps / self.rollout_seconds if self.rollout_seconds > 0 else 0.0


F = TypeVar("F")


class Bound(Collector, Generic[F]):
    """A collector of figures ``F`` read from a source bound later (``bind``); defaults until then."""

    def __init__(self, default: F, families: Callable[[F], Iterable[Metric]]) -> None:
        self._default = default
        self._families = families
        self._source: Callable[[], F] | None = None
        self._lock = threading.Lock()

    def bind(self, source: Callable[[], F] | None) -> None:
        """Read figures from ``source`` at every scrape (None: back to the defaults)."""
        with self._lock:
            self._source = source

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            source = self._source
        yield from self._families(source() if source is not None else self._default)


def _rank_zero_families(f: RankZeroFigures) -> Iterator[Metric]:
    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, value=value)

    yield gauge("rlkube_train_epoch", "Epochs (train steps) completed.", f.epoch)
    yield gauge("rlkube_train_max_epochs", "train.maxEpochs of the job.", f.max_epochs)
    yield gauge("rlkube_train_env_steps", "Env steps collected so far (resumed runs included).", f.env_steps)
    yield gauge(
        "rlkube_train_steps_per_second", "Env steps per second, over the last 30 s.", f.steps_per_second
    )
    yield gauge("rlkube_train_weight_version", "The weight version last published.", f.weight_version)
    yield gauge(
        "rlkube_train_mean_return",
        "Mean return of the last 20 training episodes (NaN before the first).",
        float("nan") if f.mean_return is None else f.mean_return,
    )
    yield gauge("rlkube_train_eval_workers", "Eval workers registered with the coordinator.", f.eval_workers)
    yield gauge("rlkube_train_finished", "1 once the job is over.", float(f.finished))
    yield gauge(
        "rlkube_fragments_in_flight",
        "Tasks leased to eval workers and not pushed yet.",
        f.fragments_in_flight,
    )
    yield CounterMetricFamily(
        "rlkube_fragments_acknowledged",
        "Fragments accepted from eval workers (first push of a task).",
        value=f.fragments_acknowledged,
    )
    yield CounterMetricFamily(
        "rlkube_fragments_dropped_stale",
        "Fragments dropped untrained: older than v - train.maxStaleness (async).",
        value=f.fragments_dropped_stale,
    )
    yield CounterMetricFamily(
        "rlkube_fragments_duplicate_pushes",
        "Pushes of an already acknowledged task (retries), counted nowhere else.",
        value=f.duplicate_pushes,
    )
    yield CounterMetricFamily(
        "rlkube_fragments_refused",
        "Pushes refused for their trajectories (the env's spaces, the schema, non-finite values).",
        value=f.fragments_refused,
    )
    yield CounterMetricFamily(
        "rlkube_fragments_quarantined",
        "Acknowledged fragments set aside untrained when taken back from the journal (this rank 0).",
        value=f.fragments_quarantined,
    )
    yield GaugeMetricFamily(
        "rlkube_train_eval_pods_evicted",
        "Eval pods barred from registering for repeatedly refused or quarantined fragments.",
        value=f.eval_pods_evicted,
    )
    yield lag_histogram(f.lag_counts)
    nodes = GaugeMetricFamily(
        "rlkube_weights_node_lag",
        "Versions a node's eval workers are behind the published one.",
        labels=["node"],
    )
    for node, lag in sorted(f.node_lag.items()):
        nodes.add_metric([node], lag)
    yield nodes


def lag_histogram(counts: Mapping[int, int]) -> HistogramMetricFamily:
    """``rlkube_fragment_lag``: the weight-version lag of every trained fragment, as a histogram."""
    buckets: list[tuple[str, float]] = []
    for bound in LAG_BUCKETS:
        buckets.append((str(float(bound)), sum(n for lag, n in counts.items() if lag <= bound)))
    buckets.append(("+Inf", sum(counts.values())))
    return HistogramMetricFamily(
        "rlkube_fragment_lag",
        "Trainer version minus the version that produced each trained fragment.",
        buckets=buckets,
        sum_value=sum(lag * n for lag, n in counts.items()),
    )


def _eval_families(f: EvalFigures) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "rlkube_eval_loaded_version", "The weight version the policy holds.", value=f.loaded_version
    )
    yield GaugeMetricFamily(
        "rlkube_eval_weight_wait_share",
        "Share of this worker's busy time spent waiting for weights instead of rolling out.",
        value=f.weight_wait_share,
    )
    yield GaugeMetricFamily(
        "rlkube_eval_rollout_steps_per_second",
        "Env steps per second of rollout time (weight waits left out).",
        value=f.rollout_steps_per_second,
    )
    yield CounterMetricFamily("rlkube_eval_env_steps", "Env steps collected.", value=f.env_steps)
    yield CounterMetricFamily("rlkube_eval_fragments", "Fragments collected and pushed.", value=f.fragments)
    yield CounterMetricFamily(
        "rlkube_eval_rollout_seconds", "Seconds spent rolling out fragments.", value=f.rollout_seconds
    )
    yield CounterMetricFamily(
        "rlkube_eval_weight_wait_seconds", "Seconds spent waiting for weights.", value=f.weight_wait_seconds
    )


RANK_ZERO_FIGURES: Bound[RankZeroFigures] = Bound(RankZeroFigures(), _rank_zero_families)
RANK_ZERO.register(RANK_ZERO_FIGURES)
EVAL_FIGURES: Bound[EvalFigures] = Bound(EvalFigures(), _eval_families)
EVAL.register(EVAL_FIGURES)


def series_names(*registries: CollectorRegistry) -> set[str]:
    """Every family and sample name the registries define (``_bucket``, ``_total`` ... included).

    From the families' types, so a labelled series nobody has observed yet is listed too.
    """
    names: set[str] = set()
    for registry in registries or (RANK_ZERO, TRAIN, EVAL):
        for family in registry.collect():
            names.add(family.name)
            names.update(family.name + suffix for suffix in _SAMPLE_SUFFIXES.get(family.type, ()))
            names.update(sample.name for sample in family.samples)
    return names


_SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}

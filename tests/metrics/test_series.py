"""The series of a pod: what a scrape shows before and after the figures are bound, and the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlkube.contract import Role, read_pod_env
from rlkube.engine.pod_metrics import count_start, start_pod_metrics
from rlkube.launch.local import Layout, Ports, pod_env
from rlkube.metrics import series
from rlkube.metrics.server import MetricsServer, serve_metrics
from rlkube.spec import parse_job

from tests.conftest import MINIMAL_JOB
from tests.metrics.scrape import scrape, value


@pytest.fixture
def unbound():
    yield
    series.RANK_ZERO_FIGURES.bind(None)
    series.EVAL_FIGURES.bind(None)


def test_the_lag_histogram_counts_each_trained_fragment_in_every_bucket_at_or_above_its_lag() -> None:
    family = series.lag_histogram({0: 5, 1: 3, 4: 2})
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert buckets["0.0"] == 5
    assert buckets["1.0"] == buckets["2.0"] == buckets["3.0"] == 8
    assert buckets["4.0"] == buckets["+Inf"] == 10
    totals = {s.name: s.value for s in family.samples if not s.name.endswith("_bucket")}
    assert totals == {"rlkube_fragment_lag_count": 10, "rlkube_fragment_lag_sum": 3 + 8}


def test_a_server_serves_default_figures_until_bound_then_the_bound_ones(unbound) -> None:
    with MetricsServer([series.RANK_ZERO, series.TRAIN], port=0, host="127.0.0.1") as server:
        url = f"http://127.0.0.1:{server.port}/metrics"
        before = scrape(url)
        assert value(before, "rlkube_train_epoch") == 0
        assert value(before, "rlkube_fragment_lag_count") == 0
        figures = series.RankZeroFigures(
            epoch=7, env_steps=1792, weight_version=8, fragments_acknowledged=28, node_lag={"node-1": 1}
        )
        series.RANK_ZERO_FIGURES.bind(lambda: figures)
        after = scrape(url)
    assert value(after, "rlkube_train_epoch") == 7
    assert value(after, "rlkube_train_env_steps") == 1792
    assert value(after, "rlkube_fragments_acknowledged_total") == 28
    assert value(after, "rlkube_weights_node_lag", node="node-1") == 1
    assert not any(name.startswith("rlkube_eval_") for name, _ in after), "eval series on a train pod"


def test_an_eval_workers_shares_and_rates_come_from_its_counters() -> None:
    figures = series.EvalFigures(env_steps=600, rollout_seconds=3.0, weight_wait_seconds=1.0)
    assert figures.weight_wait_share == 0.25
    assert figures.rollout_steps_per_second == 200
    assert series.EvalFigures().weight_wait_share == series.EvalFigures().rollout_steps_per_second == 0


def test_restarts_are_counted_in_the_pods_weight_directory(tmp_path: Path) -> None:
    assert count_start(tmp_path, "job-eval-0") == 0
    assert count_start(tmp_path, "job-eval-0") == 1
    assert count_start(tmp_path, "job-eval-1") == 0
    assert count_start(tmp_path, "job-eval-0") == 2


def test_a_taken_port_leaves_the_pod_without_metrics_rather_than_failing_it() -> None:
    with MetricsServer([series.TRAIN], port=0, host="127.0.0.1") as taken:
        assert serve_metrics([series.TRAIN], port=taken.port) is None
    assert serve_metrics([series.TRAIN], port=0) is None  # 0: serve nothing


def test_a_pod_serves_its_roles_series_on_the_contracts_port(tmp_path: Path) -> None:
    layout = Layout(
        job=parse_job(MINIMAL_JOB),
        run_dir=tmp_path,
        shm_root=tmp_path / "shm",
        nodes=1,
        ports=Ports(1, 2, (3,)),
    )
    with MetricsServer([], port=0, host="127.0.0.1") as probe:
        port = probe.port  # a port that was free a moment ago
    env = read_pod_env(pod_env(layout, Role.EVAL, 0, metrics_port=port))
    assert env.metrics_port == port
    server = start_pod_metrics(env)
    assert server is not None
    try:
        names = {name for name, _ in scrape(f"http://127.0.0.1:{port}/metrics")}
    finally:
        server.close()
    assert {
        "rlkube_eval_loaded_version",
        "rlkube_eval_restarts",
        "rlkube_weights_fetch_seconds_count",
    } <= names
    assert not any(name.startswith("rlkube_train_") for name in names)
    assert read_pod_env(pod_env(layout, Role.TRAIN, 0)).metrics_port == 0  # 0: no server

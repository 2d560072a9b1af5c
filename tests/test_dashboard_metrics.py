"""Per-step metrics reach Ray's Prometheus endpoint (what the dashboard's Metrics tab reads)."""

import re
import socket
import time
import urllib.request

import pytest
import ray

from launch.driver.metrics import DashboardMetrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        return r.read().decode()


def _poll(port: int, pattern: str, deadline_s: float = 30.0) -> re.Match:
    """Metrics are exported every few seconds: scrape until the line shows up."""
    end, text = time.monotonic() + deadline_s, ""
    while time.monotonic() < end:
        try:
            text = _scrape(port)
        except OSError:
            text = ""  # the agent's exporter may not be listening yet
        m = re.search(pattern, text, re.M)
        if m:
            return m
        time.sleep(0.5)
    homerl = [line for line in text.splitlines() if "homerl" in line]
    pytest.fail(f"no {pattern!r} on :{port}/metrics after {deadline_s}s; homerl lines: {homerl}")


@pytest.fixture
def ray_with_metrics(own_ray):
    port = _free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             _metrics_export_port=port)
    yield port
    ray.shutdown()


def test_record_reaches_prometheus_endpoint(ray_with_metrics):
    port = ray_with_metrics
    dash = DashboardMetrics("metrics-test")
    row = {"reward/mean": 0.625, "time/step_s": 1.5, "rollout/tokens_per_s": 321.0,
           "weights/version": 3, "faults/worker_restarts": 2, "policy/logp_diff": 2.5e-6,
           "policy/staleness": 1}
    dash.record(row)
    m = _poll(port, r'^\S*homerl_reward_mean\{[^}]*run="metrics-test"[^}]*\} (\S+)$')
    assert float(m.group(1)) == pytest.approx(0.625)
    text = _scrape(port)
    for name, value in [("homerl_weights_version", 3.0), ("homerl_rollout_tokens_per_s", 321.0),
                        ("homerl_worker_restarts_total", 2.0),
                        ("homerl_policy_logp_diff", 2.5e-6), ("homerl_policy_staleness", 1.0)]:
        m = re.search(rf'^\S*{name}\{{[^}}]*run="metrics-test"[^}}]*\}} (\S+)$', text, re.M)
        assert m and float(m.group(1)) == pytest.approx(value), name
    print("\n".join(line for line in text.splitlines()
                    if "homerl" in line and not line.startswith("#")))

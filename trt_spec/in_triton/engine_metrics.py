"""The engine stand-in's request metrics, as the `tensorrtllm` backend publishes them (bc.REQUEST_METRICS).

One thread refreshes the gauges every stats_check_period_ms; close() deletes the metrics before their family
(upstream-facts: triton-python-metrics-delete-order).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..records import backend_contract as bc


class EngineMetricsExporter:
    """Exporter of nv_trt_llm_request_metrics; close() at finalize."""

    def __init__(
        self,
        pb_utils: Any,
        model: str,
        version: str,
        counts: Callable[[], Any],
        period_s: float,
        log_error: Callable[[str], None] = print,
    ):
        """counts() -> reference.batching.RequestCounts, read every period_s seconds."""
        self.counts, self.period_s, self.log_error = counts, max(period_s, 0.01), log_error
        self._family = None
        self._m: dict[str, Any] = {}
        self._last: dict[str, int] = {}
        self._stop = threading.Event()
        try:
            self._family = pb_utils.MetricFamily(
                name=bc.REQUEST_METRICS, description=bc.REQUEST_METRICS_HELP, kind=pb_utils.MetricFamily.GAUGE
            )
            for t in bc.REQUEST_TYPES:
                self._m[t] = self._family.Metric(labels={"model": model, "version": version, "request_type": t})
        except Exception as e:  # noqa: BLE001 - a server without metrics: serve anyway
            log_error(f"{model}: metric {bc.REQUEST_METRICS} not published: {type(e).__name__}: {e}")
            self._m.clear()
        self._thread = threading.Thread(target=self._run, name="engine-metrics", daemon=True)
        if self._m:
            self._thread.start()

    def _run(self) -> None:
        while True:
            self.update()
            if self._stop.wait(self.period_s):
                return

    def update(self) -> None:
        """Set the gauges that changed (never raises)."""
        try:
            now = self.counts().as_labels()
            for t, v in now.items():
                if self._last.get(t) != v and t in self._m:
                    self._m[t].set(float(v))
                    self._last[t] = v
        except Exception as e:  # noqa: BLE001 - metrics must not stop the engine
            self.log_error(f"{bc.REQUEST_METRICS} not updated: {type(e).__name__}: {e}")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        self._m.clear()
        self._family = None

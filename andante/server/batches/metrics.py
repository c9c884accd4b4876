"""Batch progress and deadline risk on /metrics (a collector read at scrape time), in a
bounded number of series however many batches are open.

- `andante:batches{status}`: batches in each status of the life cycle;
- `andante:batch_requests{status, outcome}`: their requests, `outcome` total /
  completed / failed (so progress per status is completed+failed over total);
- `andante:batch_requests_in_flight`: batch requests on the engines of this server;
- `andante:batch_deadline_slack_seconds{batch_id}`: the `WORST_N` unfinished batches
  with the least slack (time left before the batch expires minus the time its remaining
  requests need at the recent pace, `BatchFeeder.slack`); `andante:batch_slack_seconds`:
  a histogram of every unfinished batch's slack; `andante:batches_at_risk`: how many
  have negative slack;
- `andante:batch_store_up`: 1 while the batch store answers, 0 during an outage (the
  progress series are then absent; the engine's series are unaffected).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from andante.runtime.durable.errors import StoreError
from andante.runtime.durable.records import STATUSES
from andante.server.batches.service import BatchService
from andante.server.metrics import PREFIX

WORST_N = 10
SLACK_BUCKETS_S = (-3600.0, -600.0, -60.0, 0.0, 60.0, 600.0, 3600.0, 6 * 3600.0, 86400.0)


class BatchCollector(Collector):
    def __init__(self, service: BatchService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(PREFIX + "batch_store_up", "1 while the batch store answers.")
        try:
            progress = list(self._progress())
        except StoreError:
            progress = []
        up.add_metric([], 0.0 if not progress or self.service.feeder.store_error else 1.0)
        yield up
        yield from progress
        yield from self._risk()

    def _progress(self) -> Iterator[Metric]:
        summary = {s.status: s for s in self.service.store.summary()}
        batches = GaugeMetricFamily(PREFIX + "batches", "Batches by status.", labels=["status"])
        requests = GaugeMetricFamily(PREFIX + "batch_requests", "Requests of the batches in "
                                     "each status: total, completed, failed.",
                                     labels=["status", "outcome"])
        for status in STATUSES:
            s = summary.get(status)
            batches.add_metric([status], float(s.num_batches if s else 0))
            for outcome in ("total", "completed", "failed"):
                requests.add_metric([status, outcome], float(getattr(s, outcome) if s else 0))
        yield batches
        yield requests
        in_flight = GaugeMetricFamily(PREFIX + "batch_requests_in_flight",
                                      "Batch requests running on this server's engines.")
        in_flight.add_metric([], float(len(self.service.feeder.running)))
        yield in_flight

    def _risk(self) -> Iterator[Metric]:
        feeder = self.service.feeder
        slacks = sorted((feeder.slack(batch), batch.id) for batch in feeder.open)
        worst = GaugeMetricFamily(PREFIX + "batch_deadline_slack_seconds", f"The {WORST_N} "
                                  "unfinished batches with the least slack: time left before "
                                  "the batch expires minus the time its remaining requests "
                                  "need at the recent pace.", labels=["batch_id"])
        for value, batch_id in slacks[:WORST_N]:
            worst.add_metric([batch_id], value)
        yield worst
        buckets = [(_le(bound), float(sum(v <= bound for v, _ in slacks)))
                   for bound in SLACK_BUCKETS_S]
        buckets.append(("+Inf", float(len(slacks))))
        histogram = HistogramMetricFamily(PREFIX + "batch_slack_seconds", "Deadline slack of "
                                          "every unfinished batch.")
        histogram.add_metric([], buckets, sum_value=sum(v for v, _ in slacks))
        yield histogram
        risk = GaugeMetricFamily(PREFIX + "batches_at_risk", "Unfinished batches that will "
                                 "miss their window at the recent pace.")
        risk.add_metric([], float(sum(v < 0 for v, _ in slacks)))
        yield risk


def _le(bound: float) -> str:
    return f"{bound:g}"

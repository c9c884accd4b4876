"""Batch progress and deadline risk on /metrics (a collector read at scrape time).

- `andante:batches{status}`: batches in each status of the life cycle;
- `andante:batch_requests{status, outcome}`: their requests, `outcome` total /
  completed / failed (so progress per status is completed+failed over total);
- `andante:batch_requests_in_flight`: batch requests on the engines of this server;
- `andante:batch_deadline_slack_seconds{batch_id}`: per unfinished batch, the time left
  before it expires minus the time its remaining requests need at the recent pace
  (`BatchFeeder.slack`); `andante:batches_at_risk`: how many have negative slack.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from andante.runtime.durable.records import STATUSES
from andante.server.batches.service import BatchService
from andante.server.metrics import PREFIX


class BatchCollector(Collector):
    def __init__(self, service: BatchService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        yield from self._progress()
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
        slack = GaugeMetricFamily(PREFIX + "batch_deadline_slack_seconds", "Time left before "
                                  "the batch expires minus the time its remaining requests "
                                  "need at the recent pace.", labels=["batch_id"])
        at_risk = 0
        for batch in self.service.feeder.open:
            value = self.service.feeder.slack(batch)
            slack.add_metric([batch.id], value)
            at_risk += value < 0
        yield slack
        risk = GaugeMetricFamily(PREFIX + "batches_at_risk", "Unfinished batches that will "
                                 "miss their window at the recent pace.")
        risk.add_metric([], float(at_risk))
        yield risk

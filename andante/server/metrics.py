"""Prometheus metrics under `andante:`, with the meaning of vLLM's `vllm:` metrics.

Histograms and counters are updated on the event loop from each step's deltas (the
engine threads never touch them); gauges and the preemption counter are read from the
runner's latest `SchedulerStats` at scrape time by a collector, as are the
prefix-cache counters (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens).
Each app has its own `CollectorRegistry`, so several servers (and tests) can live in
one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from andante.cluster.qlm.tiers import ModelSwap
from andante.engine.stats import SchedulerStats
from andante.metrics import e2el, itls, qoe_of, ttft
from andante.server.outputs import Delta

PREFIX = "andante:"
# the load gauges again under vLLM's own names, which a fleet in front of a mix of vLLM
# and andante servers reads (andante.runtime.upstream.metrics)
VLLM_PREFIX = "vllm:"
VLLM_LOAD_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
SWAP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
QOE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class _EngineCollector(Collector):
    """Gauges (and the preemption counter) from the latest stats."""

    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats]) -> None:
        self._model = model_name
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        snap = self._stats()
        gauges = (
            ("num_requests_running", "Requests in the running batch.", snap.num_running),
            ("num_requests_waiting", "Requests waiting to be scheduled.", snap.num_waiting),
            ("num_requests_swapped", "Requests swapped out to host memory.", snap.num_swapped),
            ("kv_cache_usage_perc", "KV-cache usage (1 = full).", snap.kv_usage),
            ("num_kv_blocks", "Device KV-cache blocks (KunServe adds dropped weights).",
             snap.num_blocks),
        )
        for name, doc, value in gauges:
            prefixes = (PREFIX, VLLM_PREFIX) if name in VLLM_LOAD_GAUGES else (PREFIX,)
            for prefix in prefixes:
                family = GaugeMetricFamily(prefix + name, doc, labels=["model_name"])
                family.add_metric([self._model], float(value))
                yield family
        preempt = CounterMetricFamily(
            PREFIX + "num_preemptions", "Cumulative number of preemptions.", labels=["model_name"]
        )
        preempt.add_metric([self._model], float(snap.num_preemptions))
        yield preempt
        counters = (
            ("prefix_cache_queries", "Prefix-cache queries, in tokens (prompt tokens "
             "looked up at admissions).", snap.prefix_cache_queries),
            ("prefix_cache_hits", "Prefix-cache hits, in tokens (prefill saved).",
             snap.prefix_cache_hits),
        )
        for name, doc, value in counters:
            counter = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            counter.add_metric([self._model], float(value))
            yield counter


class _RouterCollector(Collector):
    """The router's own counters (QLM: planner invocations, plans, EDF fallbacks, model
    swaps, evictions), read at scrape time as `andante:router_<name>`."""

    def __init__(self, router: str, counters: Callable[[], Mapping[str, int]]) -> None:
        self._router = router
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        for name, value in sorted(self._counters().items()):
            counter = CounterMetricFamily(
                PREFIX + "router_" + name.removeprefix("num_"),
                f"The {self._router} router's count of {name.removeprefix('num_')}.",
                labels=["router"])
            counter.add_metric([self._router], float(value))
            yield counter


class ServerMetrics:
    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats],
                 router: tuple[str, Callable[[], Mapping[str, int]]] | None = None) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(model_name, stats))
        if router is not None:
            self.registry.register(_RouterCollector(*router))
        self._init_histograms()
        self._init_counters()

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(PREFIX + name, doc, ["model_name"], registry=self.registry,
                         buckets=buckets)

    def _init_histograms(self) -> None:
        h = self._histogram
        m = self.model_name
        self.ttft = h("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = h("inter_token_latency_seconds", "Time between tokens.", ITL_BUCKETS)
        self.e2e = h("e2e_request_latency_seconds", "End-to-end latency.", LATENCY_BUCKETS)
        self.queue = h("request_queue_time_seconds", "Time waiting before first scheduled.",
                       LATENCY_BUCKETS)
        self.qoe = h("request_qoe", "Andes QoE of finished requests (1 = perfect).", QOE_BUCKETS)
        self._ttft, self._itl = self.ttft.labels(m), self.itl.labels(m)
        self._e2e, self._queue = self.e2e.labels(m), self.queue.labels(m)
        self._qoe = self.qoe.labels(m)

    def _init_counters(self) -> None:
        m, r = self.model_name, self.registry
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prefilled prompt tokens.",
                                     ["model_name"], registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Generated tokens.",
                                         ["model_name"], registry=r)
        self.request_success = Counter(PREFIX + "request_success", "Finished requests.",
                                       ["model_name", "finished_reason"], registry=r)
        self._prompt = self.prompt_tokens.labels(m)
        self._generation = self.generation_tokens.labels(m)
        self.model_swaps = Counter(PREFIX + "model_swaps", "Model swaps (QLM LSO 5), by the "
                                   "model swapped in and the tier it came from.",
                                   ["model_name", "tier"], registry=r)
        self.model_swap_seconds = Histogram(
            PREFIX + "model_swap_seconds", "Time to swap a model in (load from host memory: "
            "warm; from disk: cold; plus the engine's rebuild).", ["tier"], registry=r,
            buckets=SWAP_BUCKETS)
        self.swap_evictions = Counter(PREFIX + "model_swap_evicted_requests", "Requests "
                                      "handed back to the controller by a model swap.",
                                      registry=r)

    def observe_swaps(self, swaps: list[ModelSwap]) -> None:
        """Runner observer: one entry per model swap of any instance."""
        for swap in swaps:
            self.model_swaps.labels(swap.incoming, swap.tier).inc()
            self.model_swap_seconds.labels(swap.tier).observe(swap.seconds)
            self.swap_evictions.inc(swap.num_evicted)

    def observe(self, deltas: list[Delta]) -> None:
        """StreamHub observer: count tokens; record latencies and QoE at finish."""
        generated = 0
        for delta in deltas:
            generated += delta.num_new_tokens
            record = delta.record
            if record is None:
                continue
            self.request_success.labels(self.model_name, delta.finish_reason or "").inc()
            if record.is_aborted:
                continue
            self._prompt.inc(record.num_prompt_tokens)
            first, last = ttft(record), e2el(record)
            if first is not None and last is not None:
                self._ttft.observe(first)
                self._e2e.observe(last)
            for gap in itls(record):
                self._itl.observe(gap)
            if delta.queue_time is not None:
                self._queue.observe(delta.queue_time)
            self._qoe.observe(qoe_of(record))
        if generated:
            self._generation.inc(generated)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def router_counters(router: Any) -> tuple[str, Callable[[], Mapping[str, int]]] | None:
    """(name, its counters) of a router that counts what it does (`counters.summary()`,
    as QLM's), for `ServerMetrics`; None for the others."""
    counters = getattr(router, "counters", None)
    if not callable(getattr(counters, "summary", None)):
        return None
    return str(getattr(router, "name", type(router).__name__)), \
        lambda: router.counters.summary()

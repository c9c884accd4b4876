"""What andante's scheduler class shows of its policy inside vLLM.

- At startup, one log line: the policy, its options, the budgets it runs under, the
  cost model, the SLO defaults and where the step log goes.
- Every `log_interval` seconds while requests are in flight, one log line of the
  policy's state: running and waiting counts, KV usage, preemptions by cause since
  start, the QoE each running and waiting request has now (Andes eq. 1-3 at this
  moment, DESIGN.md §5: mean and minimum), and the head of the waiting queue in the
  policy's order.
- Preemptions by cause: `kv` where the running requests' own growth this step took
  more blocks than were free before it (vLLM's kind of preemption: memory ran out),
  `policy` otherwise (the policy gave the victim's place to a request it preferred:
  Andes' knapsack, priority or deadline order). Each is also vLLM's own preemption,
  counted by vLLM's vllm:num_preemptions on /metrics.
- The step log (`step_log`): one JSON line per step in andante.perf.step_log's format
  (`engine` "vllm", the policy's name, the queue left, the preemptions by cause so
  far), what `andante calibrate --step-log` fits; and per request, at its first token,
  a request record (andante.perf.frontend_log: vLLM's arrival stamp, when the
  scheduler took it in, the first token; wall seconds); opened for appending,
  line-buffered. The HTTP side of the same requests comes from vLLM's API server with
  `--middleware andante.server.http_timing.HttpTiming` and ANDANTE_HTTP_LOG set to the
  same file.
"""

from __future__ import annotations

import json
import logging
from typing import IO, TYPE_CHECKING, Any

from andante.core.clock import Clock
from andante.core.request import Request
from andante.core.sampling import DEFAULT_TDS, DEFAULT_TTFT_TARGET
from andante.engine.config import SchedulerConfig
from andante.exec.batch import StepBatch
from andante.metrics.qoe import qoe
from andante.perf.cost_model import CostModel
from andante.perf.frontend_log import REQUEST_KIND
from andante.perf.step_log import step_record
from andante.vllm.config import AdapterConfig

if TYPE_CHECKING:
    from andante.vllm.scheduler import Scheduler

logger = logging.getLogger("vllm.andante")  # under vLLM's configured logger
ENGINE = "vllm"  # the step records' source
QUEUE_HEAD = 5  # waiting requests named in a state line


def qoe_now(req: Request, now: float) -> float:
    """The request's QoE at `now` with its own targets (andante's defaults otherwise)."""
    slo = req.slo
    return qoe(req.arrival_time, req.timeline.token_times,
               slo.ttft if slo.ttft is not None else DEFAULT_TTFT_TARGET,
               slo.tds if slo.tds is not None else DEFAULT_TDS, now=now,
               max_tokens=max(req.sampling.max_tokens, req.num_output_tokens))


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"mean {sum(values) / len(values):.2f} min {min(values):.2f}"


class Observer:
    def __init__(self, config: AdapterConfig, policy: str, clock: Clock) -> None:
        self.policy = policy
        self.clock = clock
        self.interval = config.log_interval
        self.preemptions = {"kv": 0, "policy": 0}
        self._last_log = clock.now()
        self._log: IO[str] | None = None
        self._log_path = config.step_log
        self._options = config.policy_options

    def log_startup(self, vllm_version: str, costs: CostModel | None,
                    config: SchedulerConfig) -> None:
        if self._log_path:  # opened here, not in the constructor (no I/O there)
            self._log = open(self._log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        model = f"{costs.model.name} on {costs.hardware.name}" if costs else "none"
        logger.info(
            "andante.vllm: policy %s (options %s) on vLLM %s; max_num_seqs %d, "
            "max_num_batched_tokens %d, max_model_len %d, block %d, preemption recompute "
            "(vLLM v1 has no swap); cost model %s; SLO defaults ttft %.1f s, tds %.1f "
            "tokens/s (vllm_xargs ttft/tbt/tds/deadline per request); step log %s",
            self.policy, self._options or "{}", vllm_version, config.max_num_seqs,
            config.max_num_batched_tokens, config.max_model_len, config.block_size, model,
            DEFAULT_TTFT_TARGET, DEFAULT_TDS, self._log_path or "off")

    def count_preemptions(self, num: int, kv_shortage: bool) -> None:
        self.preemptions["kv" if kv_shortage else "policy"] += num

    def state(self, sched: Scheduler) -> dict[str, Any]:
        """The policy's state now (what the periodic log line shows)."""
        now = self.clock.now()
        waiting = sched.mirror_waiting
        return {
            "policy": self.policy, "num_running": len(sched.mirror_running),
            "num_waiting": len(waiting), "kv_usage": sched.kv_cache_manager.usage,
            "preemptions": dict(self.preemptions),
            "qoe_running": [qoe_now(r, now) for r in sched.mirror_running],
            "qoe_waiting": [qoe_now(r, now) for r in waiting],
            "queue_head": [r.request_id for r in waiting[:QUEUE_HEAD]],
        }

    def maybe_log_state(self, sched: Scheduler) -> None:
        if not self.interval or not (sched.mirror_running or sched.mirror_waiting):
            return
        now = self.clock.now()
        if now - self._last_log < self.interval:
            return
        self._last_log = now
        s = self.state(sched)
        logger.info(
            "andante.vllm [%s]: running %d, waiting %d, KV %.0f%%; preemptions kv %d, "
            "policy %d; QoE now: running %s, waiting %s; queue head %s", s["policy"],
            s["num_running"], s["num_waiting"], 100 * s["kv_usage"], s["preemptions"]["kv"],
            s["preemptions"]["policy"], _summary(s["qoe_running"]),
            _summary(s["qoe_waiting"]), s["queue_head"])

    @property
    def logs_steps(self) -> bool:
        """Is the step log on (set from `step_log` by `log_startup`)?"""
        return self._log is not None

    def log_request(self, request_id: str, arrival: float, seen: float, idle: bool,
                    first_token: float) -> None:
        """A request record (andante.perf.frontend_log), wall seconds: vLLM's arrival
        stamp, when the scheduler took the request in (`idle`: the engine core had no
        request then, so it took it in at once, not at the end of a step), when its
        first token came out."""
        if self._log is None:
            return
        record = {"kind": REQUEST_KIND, "engine": ENGINE, "id": request_id,
                  "arrival": arrival, "seen": seen, "idle": idle,
                  "first_token": first_token, "to_engine": seen - arrival}
        self._log.write(json.dumps(record) + "\n")

    def log_step(self, batch: StepBatch, duration: float, num_waiting: int) -> None:
        if self._log is None or not batch.requests or duration <= 0:
            return
        record = step_record(batch.shape(), duration, sum(batch.num_cached_tokens),
                             engine=ENGINE, t=self.clock.now(), policy=self.policy,
                             num_waiting=num_waiting, preemptions=dict(self.preemptions))
        self._log.write(json.dumps(record) + "\n")

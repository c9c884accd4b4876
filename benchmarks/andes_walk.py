"""The walk of one `andes` scheduling decision: which of andante's modules it passes
through, and whether a helper calls back into the policy.

Traces (sys.settrace) one `AndesPolicy.schedule` call where the knapsack runs
(selective triggering forced: watermark 0, every step) with the refiner on, 16 running
and 8 queued requests whose gains differ, on the llama-3.1-8b / a100-80g cost model.
Prints ONE JSON line:
- `files`: the Python files of the `andes` policy (its package, plus any module outside
  it named `andes*`);
- `calls`: function entries in andante's code during the call;
- `steps`: calls that cross from one andante module into another (`policy_steps`: of
  them, those between modules of andante.policies);
- `modules`: the distinct andante modules entered (`policy_modules`: of andante.policies;
  `module_list`, all of them in first-entry order);
- `walk_steps`: how often the andante.policies module executing changes (by a call or a
  return), as a reader following the call would turn pages, and `walk_policy_returns`:
  how often that walk comes back to the policy class's module;
- `policy_module_reentries`: calls into the policy class's module from another andante
  module, and `helper_calls_into_policy`: calls of the policy object's methods from code
  outside its class's module (a helper or a mixin in another file calling back into
  the policy);
- `num_solves_in_walk`: knapsack solves during the call (1: the scenario's branch).
The scenario is fixed, so runs on two trees compare their structure (run it with
PYTHONPATH set to each).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import andante
from andante.core import ManualClock, Request, SamplingParams, SyntheticTokens
from andante.core.sampling import SLO
from andante.engine import Engine
from andante.engine.plan import StepPlan
from andante.llm import build_engine
from andante.perf.catalog import get_hardware, get_model
from andante.perf.cost_model import CostModel
from andante.policies import SchedulerConfig

PACKAGE = Path(andante.__file__).resolve().parent
NUM_RUNNING, NUM_QUEUED = 16, 8
TDS = (3.3, 4.0, 4.8, 5.5, 6.5)
_POLICIES = "andante.policies."


class _NoopExecutor:
    def __init__(self, cost_model: CostModel, num_blocks: int) -> None:
        self.cost_model = cost_model
        self._num_blocks = num_blocks

    def num_kv_blocks(self, block_size: int) -> tuple[int, int]:
        return self._num_blocks, self._num_blocks

    def execute(self, batch: Any) -> Any:
        from andante.exec.batch import StepResult
        return StepResult([0 if s else None for s in batch.samples], 0.03)


def _request(i: int, arrival: float, prompt: int) -> Request:
    return Request(
        request_id=f"r{i}", prompt_token_ids=SyntheticTokens(prompt),
        sampling=SamplingParams(max_tokens=100_000, ignore_eos=True), arrival_time=arrival,
        slo=SLO(ttft=max(prompt / 5000, 1.0), tds=TDS[i % len(TDS)]),
    )


def scenario() -> tuple[Engine, ManualClock]:
    """The scenario of the module note, just before the traced decision."""
    clock = ManualClock()
    cost = CostModel(get_model("llama-3.1-8b"), get_hardware("a100-80g"))
    config = SchedulerConfig(max_num_seqs=64, max_model_len=8192)
    options = {"watermark": 0.0, "solver_interval": 1}
    engine = build_engine(_NoopExecutor(cost, 40 * NUM_RUNNING + 64), clock, "andes",
                          config, options)
    for i in range(NUM_RUNNING):
        engine.add_request(_request(i, 0.0, 256 + 16 * (i % 32)))
    while engine.scheduler.num_running < NUM_RUNNING:
        engine.step()
    for step in range(60):  # some streaming history
        clock.advance_to(0.05 * step)
        engine.step()
    for i in range(NUM_QUEUED):
        engine.add_request(_request(NUM_RUNNING + i, 3.0 + i * 1e-3, 64 + (37 * i) % 2000))
    clock.advance_to(20.0)
    return engine, clock


def _module_of(frame: FrameType) -> str | None:
    """The andante module of `frame`'s code (None: outside andante)."""
    path = Path(frame.f_code.co_filename)
    try:
        rel = path.resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    return ".".join(("andante", *rel.with_suffix("").parts))


def _owner(frame: FrameType | None) -> object:
    return None if frame is None else frame.f_locals.get("self")


def trace_walk(schedule: Callable[[StepPlan], None], plan: StepPlan, policy: object,
               ) -> dict[str, Any]:
    """The figures of the module note for one `schedule(plan)` call."""
    calls = steps = policy_steps = module_reentries = object_reentries = 0
    modules: list[str] = []
    policy_module = type(policy).__module__

    walk: list[str] = []  # the policies' module executing, as it changes

    def follow(module: str | None) -> None:
        if module is not None and module.startswith(_POLICIES) and (
                not walk or walk[-1] != module):
            walk.append(module)

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return":
            follow(_module_of(frame.f_back) if frame.f_back is not None else None)
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal calls, steps, policy_steps, module_reentries, object_reentries
        if event != "call":
            return None
        module = _module_of(frame)
        if module is None:
            return None
        follow(module)
        calls += 1
        if module not in modules:
            modules.append(module)
        caller = _module_of(frame.f_back) if frame.f_back is not None else None
        if caller is not None and caller != module:
            steps += 1
            policy_steps += caller.startswith(_POLICIES) and module.startswith(_POLICIES)
            module_reentries += module == policy_module
        if _owner(frame) is policy and caller != policy_module:
            object_reentries += 1
        return local

    sys.settrace(tracer)
    try:
        schedule(plan)
    finally:
        sys.settrace(None)
    return {"calls": calls, "steps": steps, "policy_steps": policy_steps,
            "modules": len(modules),
            "policy_modules": sum(m.startswith(_POLICIES) for m in modules),
            "policy_module_reentries": module_reentries,
            "helper_calls_into_policy": object_reentries - 1,  # (less the call itself)
            "walk_steps": len(walk) - 1,
            "walk_policy_returns": walk.count(policy_module) - 1,
            "module_list": modules}


def andes_files() -> list[str]:
    package = PACKAGE / "policies" / "andes"
    files = sorted(p for p in package.glob("*.py"))
    files += sorted(p for p in PACKAGE.rglob("andes*.py") if package not in p.parents)
    return [str(p.relative_to(PACKAGE.parent)) for p in files]


def walk_one_decision(engine: Engine) -> dict[str, Any]:
    """The figures of one traced `schedule` call of the engine's policy (the scheduler's
    next step, applied; `num_solves_in_walk`: knapsack solves during it)."""
    scheduler = engine.scheduler
    policy = scheduler.policy
    captured: dict[str, Any] = {}
    original = policy.schedule

    def traced(plan: StepPlan) -> None:
        captured.update(trace_walk(original, plan, policy))

    stats = getattr(policy, "stats", None)
    solves = getattr(stats, "num_solves", 0)
    policy.schedule = traced  # type: ignore[method-assign]
    try:
        scheduler.schedule()
    finally:
        del policy.schedule  # type: ignore[method-assign]
    captured["num_solves_in_walk"] = getattr(stats, "num_solves", 0) - solves
    return captured


def main() -> None:
    engine, _ = scenario()
    figures = walk_one_decision(engine)
    files = andes_files()
    print(json.dumps({"benchmark": "andes_walk", "andante": str(PACKAGE),
                      "files": len(files), "file_list": files, **figures}))


if __name__ == "__main__":
    main()

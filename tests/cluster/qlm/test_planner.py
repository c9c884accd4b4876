import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from andante.cluster.qlm.edf_plan import edf_queues
from andante.cluster.qlm.estimator import OutputLengthModel, RCTEstimator
from andante.cluster.qlm.groups import form_groups
from andante.cluster.qlm.milp import build_milp, queue_length, start_values
from andante.cluster.qlm.plan_problem import (
    PlannerOptions,
    PlanProblem,
    build_problem,
    evaluate_queues,
)
from andante.cluster.qlm.planner import generate_plan, solve_problem
from tests.cluster.qlm.helpers import GB, FlatCost, request, view


def random_problem(n: int, g: int, s: int, seed: int, slo_scale: float = 1.0,
                   num_models: int = 2) -> PlanProblem:
    rng = np.random.default_rng(seed)
    drain = (rng.uniform(1, 5, (n, 1, 1)) * rng.uniform(0.8, 1.2, (n, g, s))
             * rng.uniform(0.5, 1.5, (1, g, 1)))
    return PlanProblem(
        group_ids=tuple(f"g{i}" for i in range(n)), instance_ids=tuple(f"i{k}" for k in range(g)),
        models=tuple(f"m{k}" for k in range(num_models)),
        group_model=rng.integers(0, num_models, n),
        slo=rng.uniform(4, 16, n) * slo_scale, drain=drain, completion=drain * 1.1 + 0.5,
        swap_in=rng.uniform(0.5, 3, (g, num_models)),
        on_device=np.eye(g, num_models, dtype=bool), base=rng.uniform(0, 1, g),
        allowed=np.ones((n, g), dtype=bool))


def brute_force(p: PlanProblem, options: PlannerOptions) -> float | None:
    """Best eq. 13 objective (with the penalty of each group relaxed past eq. 12) over
    every assignment and order."""
    n, g = len(p.group_ids), len(p.instance_ids)
    best = None
    for order in itertools.permutations(range(n)):
        for assign in itertools.product(range(g), repeat=n):
            if any(not p.allowed[i, assign[i]] for i in range(n)):
                continue
            ev = evaluate_queues(p, [[i for i in order if assign[i] == k] for k in range(g)],
                                 options)
            if best is None or ev.objective < best:
                best = ev.objective
    return best


# (seed, SLO scale, chance level Δ, swap weight); S = 6 samples, k = floor((1 - Δ) S) may
# miss. The chance constraint binds in these cases: each optimum differs from the optimum
# with a looser Δ (see test_chance_constraint_binds).
CASES = [(1, 1.0, 1.0, 0.0), (2, 1.0, 1.0, 0.0), (4, 1.3, 1.0, 0.0), (4, 1.3, 0.8, 0.5),
         (8, 1.6, 0.8, 0.0), (8, 1.6, 1.0, 2.0), (0, 1.0, 1.0, 1.0)]


@pytest.mark.parametrize(("seed", "slo_scale", "level", "swap_weight"), CASES)
def test_milp_matches_brute_force_on_two_instances_and_four_groups(seed, slo_scale, level,
                                                                   swap_weight):
    p = random_problem(4, 2, 6, seed, slo_scale)
    options = PlannerOptions(num_samples=6, chance_level=level, swap_weight=swap_weight,
                             work_limit=100_000)
    best = brute_force(p, options)
    assert best is not None
    plan = solve_problem(p, options)
    assert plan.status == "optimal" and not plan.fallback and plan.feasible
    assert plan.objective == pytest.approx(best, abs=1e-6)


def test_chance_constraint_binds():
    p = random_problem(4, 2, 6, seed=8, slo_scale=1.6)
    strict = solve_problem(p, PlannerOptions(num_samples=6, chance_level=1.0))
    loose = solve_problem(p, PlannerOptions(num_samples=6, chance_level=0.8))
    assert strict.objective > loose.objective + 1.0
    assert not evaluate_queues(p, [[p.group_ids.index(g) for g in q.group_ids]
                                   for q in loose.queues], PlannerOptions(
                                       num_samples=6, chance_level=1.0)).feasible


def test_milp_respects_memory_and_the_chance_constraint():
    p = random_problem(4, 2, 6, seed=7)
    allowed = p.allowed.copy()
    allowed[0, 0] = allowed[1, 0] = False  # groups 0 and 1 do not fit on instance 0
    p = PlanProblem(p.group_ids, p.instance_ids, p.models, p.group_model, p.slo, p.drain,
                    p.completion, p.swap_in, p.on_device, p.base, allowed)
    options = PlannerOptions(num_samples=6, chance_level=1.0, work_limit=100_000)
    plan = solve_problem(p, options)
    assert {"g0", "g1"} <= set(plan.queues[1].group_ids)
    assert plan.objective == pytest.approx(brute_force(p, options), abs=1e-6)


def test_hopeless_groups_are_relaxed_and_the_plan_still_decides():
    p = random_problem(5, 2, 4, seed=3, slo_scale=0.05)  # SLOs shorter than any completion
    plan = solve_problem(p, PlannerOptions(num_samples=4, chance_level=1.0))
    assert not plan.fallback and plan.needs_capacity and not plan.feasible
    assert plan.missed == 5 and "more capacity" in plan.reason
    assert plan.status == "optimal"


def test_one_hopeless_group_does_not_cost_the_others_their_slos():
    """Hard chance constraints would make this program infeasible (group 0 cannot make
    its SLO anywhere); relaxed at a penalty, the plan gives up group 0 alone and keeps
    the others within their SLOs, which EDF (group 0 first) does not."""
    drain = np.array([4.0, 2.0, 2.0, 2.0])[:, None, None] * np.ones((4, 1, 4))
    drain[:, 0, 0] *= 1.1  # one slower sample
    p = PlanProblem(("g0", "g1", "g2", "g3"), ("i0",), ("m0",), np.zeros(4, dtype=int),
                    slo=np.array([1.0, 3.0, 5.5, 8.0]), drain=drain, completion=drain.copy(),
                    swap_in=np.zeros((1, 1)), on_device=np.ones((1, 1), dtype=bool),
                    base=np.zeros(1), allowed=np.ones((4, 1), dtype=bool))
    options = PlannerOptions(num_samples=4, chance_level=1.0, work_limit=100_000)
    edf = evaluate_queues(p, edf_queues(p), options)
    plan = solve_problem(p, options)
    assert edf.missed > 1
    assert not plan.fallback and plan.missed == 1 and plan.source == "milp"
    assert plan.queues[0].group_ids[-1] == "g0"  # given the tail


def test_too_few_samples_for_the_chance_level_is_refused():
    with pytest.raises(ValueError, match="num_samples >= 10"):
        PlannerOptions(num_samples=8, chance_level=0.9)
    assert PlannerOptions().allowed_violations >= 1


def test_plan_is_never_worse_than_edf_even_when_the_work_budget_binds():
    p = random_problem(30, 3, 4, seed=11, slo_scale=6.0, num_models=3)
    options = PlannerOptions(num_samples=4, chance_level=0.75, work_limit=1)
    plan = solve_problem(p, options)
    edf = evaluate_queues(p, edf_queues(p), options)
    assert edf.feasible and plan.feasible and not plan.fallback
    assert plan.status == "work_limit"
    assert plan.objective <= edf.objective + 1e-6


@pytest.mark.parametrize(("n", "horizon", "work_limit"), [(30, 12, 1), (30, 12, 2),
                                                           (20, None, 3)])
def test_a_budget_limited_plan_is_the_same_every_time(n, horizon, work_limit):
    """The budget is HiGHS's work (limit checks, nodes), not wall-clock time: the same
    inputs give the same plan although the solver stopped early."""
    p = random_problem(n, 3, 4, seed=11, slo_scale=6.0, num_models=3)
    options = PlannerOptions(num_samples=4, chance_level=0.75, work_limit=work_limit,
                             horizon_groups=horizon)
    plans = [solve_problem(p, options) for _ in range(3)]
    assert all(plan.status == "work_limit" for plan in plans)
    assert len({tuple(q.group_ids for q in plan.queues) for plan in plans}) == 1
    assert len({plan.objective for plan in plans}) == 1
    unlimited = solve_problem(p, PlannerOptions(num_samples=4, chance_level=0.75,
                                                horizon_groups=horizon, work_limit=100_000))
    assert unlimited.objective <= plans[0].objective + 1e-6



def test_generate_plan_end_to_end_places_every_group_once():
    reqs = [request(f"r{k}", model=("m1", "m2")[k % 2], slo=60.0 + 10 * k, arrival=0.0,
                    slo_class=("interactive", "batch")[k % 3 == 0]) for k in range(24)]
    groups = form_groups(reqs, avg_batch_size=2, delta=2.0)
    est = RCTEstimator(FlatCost(), OutputLengthModel(prior_mean=100.0, prior_std=20.0),
                       model_bytes={"m1": 2 * GB, "m2": 30 * GB})
    views = [view("small", on_device=("m1",), memory=24 * GB), view("big", on_device=("m2",))]
    plan = generate_plan(groups, views, est, now=0.0, options=PlannerOptions(work_limit=100_000))
    placed = [gid for q in plan.queues for gid in q.group_ids]
    assert sorted(placed) == sorted(g.group_id for g in groups)
    m2_groups = {g.group_id for g in groups if g.model == "m2"}
    assert m2_groups <= set(plan.queues[1].group_ids)  # m2 does not fit in 24 GB
    assert plan.feasible and not plan.needs_capacity


def test_build_problem_shapes_and_swap_times():
    groups = form_groups([request("a", model="m1"), request("b", model="m3")], 8)
    est = RCTEstimator(FlatCost(), OutputLengthModel(), model_bytes={"m1": GB, "m3": 4 * GB})
    p = build_problem(groups, [view(on_device=("m1",), on_host=("m3",))], est, now=0.0,
                      options=PlannerOptions(num_samples=5, chance_level=0.8))
    assert p.shape == (2, 1, 2, 5)
    assert p.swap_in[0, p.models.index("m3")] == pytest.approx(0.4)
    assert p.on_device[0].tolist() == [True, False]


def test_options_and_problem_validation():
    with pytest.raises(ValueError, match="1.5"):
        PlannerOptions(chance_level=1.5)
    with pytest.raises(ValueError, match="0"):
        PlannerOptions(num_samples=0)
    assert PlannerOptions(num_samples=10, chance_level=0.8).allowed_violations == 2
    p = random_problem(2, 1, 2, seed=0)
    with pytest.raises(ValueError, match="fit on no instance"):
        PlanProblem(p.group_ids, p.instance_ids, p.models, p.group_model, p.slo, p.drain,
                    p.completion, p.swap_in, p.on_device, p.base, np.zeros((2, 1), dtype=bool))
    with pytest.raises(ValueError, match="exactly once"):
        evaluate_queues(p, [[0]], PlannerOptions())


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 7), st.integers(1, 3), st.integers(0, 10**6),
       st.sampled_from([0.6, 1.0, 3.0]), st.sampled_from([None, 3]))
def test_any_plan_places_each_group_once_where_it_fits(n, g, seed, slo_scale, horizon):
    p = random_problem(n, g, 3, seed, slo_scale, num_models=3)
    allowed = p.allowed.copy()
    allowed[:, 0] = np.random.default_rng(seed).random(n) < 0.5
    allowed[~allowed.any(axis=1), -1] = True
    p = PlanProblem(p.group_ids, p.instance_ids, p.models, p.group_model, p.slo, p.drain,
                    p.completion, p.swap_in, p.on_device, p.base, allowed)
    options = PlannerOptions(num_samples=3, chance_level=2 / 3, work_limit=100_000,
                             horizon_groups=horizon)
    plan = solve_problem(p, options)
    placed = [gid for q in plan.queues for gid in q.group_ids]
    assert sorted(placed) == sorted(p.group_ids)
    for gi, q in enumerate(plan.queues):
        assert all(allowed[p.group_ids.index(gid), gi] for gid in q.group_ids)
    edf = evaluate_queues(p, edf_queues(p), options)
    assert not plan.fallback  # the relaxed program always has a plan
    assert plan.needs_capacity == (not plan.feasible)
    assert plan.objective <= edf.objective + 1e-6


@pytest.mark.parametrize(("seed", "level", "swap_weight"), [(0, 1.0, 0.0), (3, 0.6, 1.0),
                                                            (5, 0.8, 0.3)])
def test_milp_encoding_agrees_with_the_evaluator_on_a_given_plan(seed, level, swap_weight):
    # The MILP vector of the EDF plan satisfies every row and bound, and its cost is the
    # evaluator's eq. 13 objective (plus Σ slo, a constant left out of the program).
    p = random_problem(6, 2, 5, seed, slo_scale=3.0, num_models=3)
    options = PlannerOptions(num_samples=5, chance_level=level, swap_weight=swap_weight)
    model = build_milp(p, options, queue_length(p, options))
    queues = edf_queues(p)
    ev = evaluate_queues(p, queues, options)
    assert ev.feasible
    v = start_values(p, model.layout, queues)
    start, index, value = model.matrix
    rows = np.zeros(len(model.row_lower))
    for col in range(len(v)):
        rows[index[start[col]:start[col + 1]]] += value[start[col]:start[col + 1]] * v[col]
    assert np.all(rows >= model.row_lower - 1e-6) and np.all(rows <= model.row_upper + 1e-6)
    assert np.all(v >= model.lower) and np.all(v <= model.upper)
    assert float(model.cost @ v) == pytest.approx(ev.objective + p.slo.sum(), rel=1e-9)

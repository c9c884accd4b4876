"""Multi-model simulated instances: model tiers, the swap operation, cluster files."""

from __future__ import annotations

from pathlib import Path

import pytest

from andante.cluster.instance import SWAP_MODEL
from andante.cluster.qlm.tiers import DEVICE, DISK, HOST, ModelTiers
from andante.core.request import Request
from andante.perf.catalog import get_hardware, get_model
from andante.sim import ClusterSpec, simulate
from andante.sim.cluster_file import cluster_from_toml, load_cluster_file
from andante.sim.setup import build_simulator
from andante.workload.spec import RequestSpec, to_requests

MISTRAL, VICUNA, LLAMA8 = "mistral-7b", "vicuna-13b", "llama-3.1-8b"
GIB = 1 << 30


def _tiers(host_gib: float = 64.0, warm: tuple[str, ...] = ()) -> ModelTiers:
    sizes = {m: get_model(m).weight_bytes for m in (MISTRAL, VICUNA, LLAMA8)}
    return ModelTiers(sizes, MISTRAL, get_hardware("a100-80g"), 1, int(host_gib * GIB),
                      list(warm))


def test_load_time_is_bytes_over_tier_bandwidth() -> None:
    tiers = _tiers(warm=(LLAMA8,))
    hw = get_hardware("a100-80g")
    size = get_model(VICUNA).weight_bytes
    assert tiers.tier(MISTRAL) == DEVICE and tiers.tier(LLAMA8) == HOST
    assert tiers.tier(VICUNA) == DISK
    assert tiers.load_time(MISTRAL, 0.0) == 0.0
    cold = tiers.load_time(VICUNA, 0.0)
    assert cold == pytest.approx(size / hw.disk_bandwidth + size / hw.host_link_bandwidth)
    warm = tiers.load_time(LLAMA8, 0.0)
    assert warm == pytest.approx(get_model(LLAMA8).weight_bytes / hw.host_link_bandwidth)
    assert warm < cold / 3


def test_activate_keeps_outgoing_warm_and_host_memory_is_bounded() -> None:
    tiers = _tiers(host_gib=20.0, warm=(LLAMA8,))
    seconds = tiers.load_time(VICUNA, 0.0)
    source = tiers.activate(VICUNA)
    assert (source, tiers.device) == (DISK, VICUNA) and seconds > 0
    assert tiers.host == [MISTRAL]  # llama dropped: both do not fit in 20 GiB
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        tiers.tier("nope")


def test_warm_start_overlaps_the_disk_read() -> None:
    tiers = _tiers(host_gib=100.0)
    assert tiers.warm(VICUNA, 0.0)
    assert not tiers.warm(VICUNA, 0.0)  # already warm
    early = tiers.load_time(VICUNA, 0.0)
    late = tiers.load_time(VICUNA, 100.0)
    assert late == pytest.approx(tiers.link_time(VICUNA)) and early > late


def _workload(n: int = 40) -> list[RequestSpec]:
    return [RequestSpec(i * 0.05, 200, 40, model=(VICUNA if i % 3 == 0 else MISTRAL))
            for i in range(n)]


def test_multi_model_cluster_serves_every_request_with_swaps() -> None:
    spec = ClusterSpec(model=MISTRAL, num_instances=2, models=(MISTRAL, VICUNA))
    run = simulate(spec, _workload())
    assert len(run.report.finished) == 40 and not run.report.unfinished
    assert run.report.model_swaps
    assert {s.incoming for s in run.report.model_swaps} == {MISTRAL, VICUNA}
    assert all(r.num_output_tokens == 40 for r in run.report.finished)


def test_a_model_no_instance_holds_is_rejected_with_its_reason() -> None:
    spec = ClusterSpec(model=MISTRAL, num_instances=1, models=(MISTRAL, VICUNA))
    run = simulate(spec, [RequestSpec(0.0, 200, 10, model=LLAMA8),
                          RequestSpec(0.0, 200, 10, model=MISTRAL)])
    rejected = [r for r in run.report.finished if r.timeline.rejection_reason]
    assert len(run.report.finished) == 2 and len(rejected) == 1
    assert LLAMA8 in (rejected[0].timeline.rejection_reason or "")


def test_single_model_cluster_has_no_swap_capability() -> None:
    sim = build_simulator(ClusterSpec(model=MISTRAL))
    assert SWAP_MODEL not in sim.instances[0].capabilities
    multi = build_simulator(ClusterSpec(model=MISTRAL, models=(MISTRAL, VICUNA)))
    assert SWAP_MODEL in multi.instances[0].capabilities


def test_swap_evicts_running_requests_to_the_controller_none_lost() -> None:
    spec = ClusterSpec(model=MISTRAL, num_instances=2, models=(MISTRAL, VICUNA))
    sim = build_simulator(spec)
    requests = to_requests([RequestSpec(0.0, 300, 50 + 20 * i, model=MISTRAL)
                            for i in range(12)])
    swapped: list[int] = []

    def swap_once(req: Request) -> None:
        if not swapped:
            owned = sim.instances[0].num_unfinished
            sim.instances[0].swap_model(VICUNA)
            swapped.append(owned)

    report = sim.run(requests, on_finish=swap_once)
    ids = [r.request_id for r in report.finished]
    assert len(ids) == len(set(ids)) == 12 and not report.unfinished
    swap = report.model_swaps[0]
    assert (swap.outgoing, swap.incoming, swap.source) == (MISTRAL, VICUNA, DISK)
    assert swap.num_evicted == swapped[0] > 0
    assert sum(r.timeline.num_recomputes for r in report.finished) >= swap.num_evicted - 1
    assert all(r.num_output_tokens == r.sampling.max_tokens for r in report.finished)
    assert sim.controller.num_handoffs == swap.num_evicted


def test_cluster_file_describes_a_heterogeneous_cluster(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('router = "least-loaded"\nmodels = ["mistral-7b", "vicuna-13b"]\n'
                    '[[instances]]\nhardware = "a100-80g"\nmodel = "vicuna-13b"\ncount = 2\n'
                    '[[instances]]\nhardware = "a10-24g"\nmodel = "mistral-7b"\n')
    spec = load_cluster_file(path, ClusterSpec())
    assert spec.num_instances == 3 and spec.router == "least-loaded"
    own = [spec.instance_spec(i) for i in range(3)]
    assert [(o.hardware, o.model) for o in own] == [
        ("a100-80g", VICUNA), ("a100-80g", VICUNA), ("a10-24g", MISTRAL)]
    sim = build_simulator(spec)
    assert sim.instances[2].tiers is None  # vicuna does not fit an A10: mistral only
    assert sim.instances[0].tiers is not None and sim.instances[0].tiers.models == (
        MISTRAL, VICUNA)


@pytest.mark.parametrize(("text", "message"), [
    ("colour = 1", "unknown key"),
    ("[[instances]]\ncount = 0", "count must be a positive integer"),
    ("[[instances]]\nhardware = \"tpu\"", "unknown hardware 'tpu'"),
    ("models = [\"gpt-5\"]", "unknown model 'gpt-5'"),
    ("models = [", "not valid TOML"),
])
def test_bad_cluster_files_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cluster_from_toml(text, ClusterSpec())

"""Sizing the run to the cluster, with synthetic nodes: every mode, mixed clusters, caps, invariants."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiperf.cluster.plan import format_plan, make_plan
from aiperf.cluster.resources import NodeInfo, apply_probe, node_from_ray
from aiperf.config import load_config

GiB = 2**30


def node(name: str, cpus: float, gpus: float = 0, *, detected: int | None = None, head: bool = False) -> NodeInfo:
    """A node as discovery reports it; ``detected`` GPUs as nvidia-smi lists them (default: what Ray has)."""
    count = int(gpus) if detected is None else detected
    return NodeInfo(
        node_id=f"{name}-id",
        address="10.0.0.1",
        cpus=cpus,
        gpus=gpus,
        memory_bytes=256 * GiB,
        hostname=name,
        accelerators=[{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * GiB} for _ in range(count)],
        is_head=head,
    )


def plan_for(nodes, *overrides):
    return make_plan(nodes, load_config("smoke", list(overrides)))


def per_node(plan) -> Counter:
    return Counter(s.node_id for s in plan.slots)


def test_two_core_box_runs_two_trials_of_one_core():
    plan = plan_for([node("box", 2)])
    assert plan.concurrency == 2
    assert {(s.cpus, s.gpus) for s in plan.slots} == {(1.0, 0.0)}
    assert plan.placement == "per_cpu_slot"
    assert plan.threads_per_trial == 1
    assert plan.notes == []


def test_a_language_run_plans_its_default_batch_in_sequences_not_the_image_batch():
    box, gpus = [node("box", 2)], [node("gpu", 32, 8)]
    assert make_plan(box, load_config("llm")).batch_size == load_config("llm").lm.batch_size == 16
    big = load_config("llm-official", ["lm.batch_size=1024", "lm.max_batch_tokens=1048576"])
    assert make_plan(gpus, big).batch_size == 1024  # not cut to train.max_batch_size (images)
    assert make_plan(gpus, load_config("smoke", ["train.batch_size=auto"])).batch_size == 256


def test_one_core_box_oversubscribes_to_keep_two_trials_in_flight():
    plan = plan_for([node("tiny", 1)])
    assert plan.concurrency == 2
    assert [s.cpus for s in plan.slots] == [0.5, 0.5]
    assert plan.threads_per_trial == 1
    assert any("shared between trials" in n for n in plan.notes)


def test_oversubscription_reaches_the_minimum_exactly_across_unequal_nodes():
    nodes = [node("a", 1), node("b", 1), node("c", 0.5)]
    plan = plan_for(nodes, "cluster.min_concurrent_trials=7")
    assert plan.concurrency == 7
    for n in nodes:
        assert sum(s.cpus for s in plan.slots if s.node_id == n.node_id) <= n.cpus


def test_large_cpu_node_uses_four_cores_per_trial():
    plan = plan_for([node("fat", 64)])
    assert plan.concurrency == 16 and {s.cpus for s in plan.slots} == {4.0}
    assert plan.threads_per_trial == 4


def test_explicit_cores_per_trial():
    plan = plan_for([node("n", 12)], "cluster.cpus_per_trial=3")
    assert plan.concurrency == 4 and {s.cpus for s in plan.slots} == {3.0}


def test_zero_cpu_head_runs_no_trials_but_workers_do():
    nodes = [node("head", 0, head=True), node("w1", 4), node("w2", 4)]
    plan = plan_for(nodes)
    assert per_node(plan) == {"w1-id": 4, "w2-id": 4}
    assert any("head" in n and "no CPUs or GPUs" in n for n in plan.notes)


def test_eight_gpu_node_one_trial_per_accelerator():
    plan = plan_for([node("dgx", 64, 8)])
    assert plan.placement == "per_accelerator"
    assert plan.concurrency == 8
    assert {(s.cpus, s.gpus) for s in plan.slots} == {(8.0, 1.0)}
    assert plan.batch_size == 64  # the smoke config asks for 64 explicitly
    assert plan_for([node("dgx", 64, 8)], "train.batch_size=auto").batch_size == 256


def test_eight_gpu_node_one_data_parallel_trial_per_node():
    plan = plan_for([node("dgx", 64, 8)], "cluster.placement=per_node")
    assert plan.placement == "per_node"
    assert [(s.cpus, s.gpus) for s in plan.slots] == [(64.0, 8.0)]
    assert plan.threads_per_trial == 64


@pytest.mark.parametrize(("share", "gpu_each", "cpus_each"), [(2, 0.5, 4.0), (3, 0.3333, 2.0), (6, 0.1666, 1.0)])
def test_eight_gpu_node_fractional_sharing(share, gpu_each, cpus_each):
    plan = plan_for([node("dgx", 64, 8)], "cluster.placement=fractional", f"cluster.trials_per_accelerator={share}")
    assert plan.concurrency == 8 * share
    assert {(s.cpus, s.gpus) for s in plan.slots} == {(cpus_each, gpu_each)}
    # Ray packs fractions onto one device only if they fit; they must never add up to more than one GPU.
    assert share * gpu_each <= 1.0


def test_gpu_node_without_cpus_still_gets_schedulable_trials():
    for placement in ("per_accelerator", "per_node", "fractional"):
        plan = plan_for([node("gpu-only", 0, 4)], f"cluster.placement={placement}")
        assert plan.slots and all(s.cpus == 0 for s in plan.slots), placement
        assert sum(s.gpus for s in plan.slots) == pytest.approx(4.0, abs=1e-3)


def test_uneven_cpu_split_rounds_down():
    plan = plan_for([node("odd", 3, 2)], "cluster.placement=fractional", "cluster.trials_per_accelerator=2")
    assert plan.concurrency == 4
    assert sum(s.cpus for s in plan.slots) <= 3.0


def test_mixed_cluster_runs_trials_only_on_gpu_nodes():
    nodes = [node("login", 16, head=True), node("a", 32, 4), node("b", 48, 2)]
    plan = plan_for(nodes)
    assert per_node(plan) == {"a-id": 4, "b-id": 2}
    assert {s.cpus for s in plan.slots if s.node_id == "a-id"} == {8.0}
    assert {s.cpus for s in plan.slots if s.node_id == "b-id"} == {24.0}
    assert plan.placement == "per_accelerator"
    assert any(n.startswith("node login: CPU-only node in a GPU cluster") for n in plan.notes)


def test_gpus_ray_does_not_schedule_are_reported():
    plan = plan_for([node("half", 32, 4, detected=8)])
    assert plan.concurrency == 4
    assert any("8 GPUs detected but Ray schedules 4" in n for n in plan.notes)


def test_cap_spreads_trials_over_nodes_and_gives_them_the_cores():
    nodes = [node("a", 64, 8), node("b", 64, 8)]
    plan = plan_for(nodes, "cluster.max_concurrent_trials=4")
    assert per_node(plan) == {"a-id": 2, "b-id": 2}
    assert {(s.cpus, s.gpus) for s in plan.slots} == {(32.0, 1.0)}
    assert any("capped at 4" in n for n in plan.notes)


def test_cap_on_cpu_nodes_with_explicit_cores_keeps_them():
    plan = plan_for([node("n", 32)], "cluster.max_concurrent_trials=2", "cluster.cpus_per_trial=4")
    assert [(s.cpus, s.index) for s in plan.slots] == [(4.0, 0), (4.0, 1)]
    auto = plan_for([node("n", 32)], "cluster.max_concurrent_trials=2")
    assert [s.cpus for s in auto.slots] == [16.0, 16.0]


def test_cap_below_the_oversubscription_minimum_wins():
    plan = plan_for([node("tiny", 1)], "cluster.max_concurrent_trials=1")
    assert [(s.cpus, s.gpus) for s in plan.slots] == [(1.0, 0.0)]


def test_empty_cluster_has_no_slots():
    assert plan_for([]).slots == []
    assert plan_for([node("dead", 0)]).slots == []


def test_thousands_of_nodes():
    nodes = [node(f"n{k:04d}", 64, 8) for k in range(4096)]
    plan = plan_for(nodes)
    assert plan.concurrency == 8 * 4096
    assert len({(s.node_id, s.index) for s in plan.slots}) == plan.concurrency


def test_plan_is_recorded_and_printed():
    plan = plan_for([node("login", 16, head=True), node("dgx", 64, 8)])
    data = plan.to_dict()
    assert data["concurrency"] == 8 and len(data["nodes"]) == 2 and data["notes"]
    text = format_plan(plan)
    assert text.startswith("plan: 8 concurrent trials on 2 node(s), placement per_accelerator")
    assert "node dgx: 64 CPUs, 8x NVIDIA H100 80GB HBM3 (80 GiB), 256.0 GiB -> 8 trial(s) x 8 CPU + 1 GPU" in text
    assert "node login: 16 CPUs, 256.0 GiB -> 0 trial(s) x -" in text
    assert "note: node login: CPU-only node in a GPU cluster" in text


def test_the_recorded_plan_is_every_field_of_the_plan_and_a_copy_of_it():
    # to_dict is written out for speed (65,536 slots): it must still hold every field, as asdict would.
    import dataclasses

    plan = plan_for([node("login", 16, head=True), node("dgx", 64, 8), node("cpu", 32)])
    data = plan.to_dict()
    assert data == {**dataclasses.asdict(plan), "concurrency": plan.concurrency}
    assert [type(s) for s in data["slots"]] == [dict] * plan.concurrency
    data["nodes"][0]["cpus"] = -1
    data["notes"].append("changed")
    assert plan.nodes[0]["cpus"] != -1 and "changed" not in plan.notes  # the record does not alias the plan


def test_discovery_records_from_ray_and_probe():
    raw = {
        "NodeID": "abc123",
        "Alive": True,
        "NodeManagerAddress": "10.1.2.3",
        "NodeManagerHostname": "gpu17",
        "Resources": {
            "CPU": 96.0,
            "GPU": 8.0,
            "memory": 1.5e12,
            "node:10.1.2.3": 1.0,
            "accelerator_type:H100": 1.0,
            "node:__internal_head__": 1.0,
        },
    }
    n = node_from_ray(raw)
    assert (n.cpus, n.gpus, n.is_head, n.hostname) == (96.0, 8.0, True, "gpu17")
    assert "node:10.1.2.3" not in n.resources
    assert n.accelerator_name == "H100"  # without a probe, Ray's accelerator type names the GPU
    apply_probe(
        n,
        {
            "hostname": "gpu17.cluster",
            "cpu_model": "EPYC",
            "memory_bytes": 2 * 2**40,
            "accelerators": [{"name": "NVIDIA H100", "memory_bytes": 80 * GiB}] * 8,
        },
    )
    assert (n.hostname, n.memory_bytes, n.gpu_memory_bytes, n.accelerator_name) == (
        "gpu17.cluster",
        2 * 2**40,
        80 * GiB,
        "NVIDIA H100",
    )


_cpus = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 7.0, 16.0, 64.0, 96.0])
_gpus = st.sampled_from([0, 0, 1, 2, 3, 4, 8])


@settings(max_examples=300, deadline=None)
@given(
    shape=st.lists(st.tuples(_cpus, _gpus), min_size=1, max_size=6),
    placement=st.sampled_from(["per_accelerator", "per_node", "fractional"]),
    share=st.integers(1, 8),
    cap=st.none() | st.integers(1, 20),
    per=st.sampled_from(["auto", "1", "2", "4"]),
    want=st.integers(1, 8),
)
def test_every_plan_fits_the_nodes_and_leaves_no_gpu_idle(shape, placement, share, cap, per, want):
    nodes = [node(f"n{k}", c, g) for k, (c, g) in enumerate(shape)]
    overrides = [
        f"cluster.placement={placement}",
        f"cluster.trials_per_accelerator={share}",
        f"cluster.cpus_per_trial={per}",
        f"cluster.min_concurrent_trials={want}",
    ]
    if cap is not None:
        overrides.append(f"cluster.max_concurrent_trials={cap}")
    plan = plan_for(nodes, *overrides)
    has_gpu = any(n.gpus >= 1 for n in nodes)
    assert len({(s.node_id, s.index) for s in plan.slots}) == plan.concurrency, "slot ids repeat"
    for n in nodes:
        mine = [s for s in plan.slots if s.node_id == n.node_id]
        # Ray can schedule every worker: no slot asks for more than its node has.
        assert sum(s.cpus for s in mine) <= n.cpus + 1e-9
        assert sum(s.gpus for s in mine) <= n.gpus + 1e-9
        assert all(abs(s.gpus * 10_000 - round(s.gpus * 10_000)) < 1e-6 for s in mine), "below Ray's granularity"
        assert sorted(s.index for s in mine) == list(range(len(mine)))
        if has_gpu and n.gpus < 1:
            assert not mine, "a CPU-only node runs trials in a GPU cluster"
        if cap is None and n.gpus >= 1:
            assert sum(s.gpus for s in mine) >= n.gpus * (1 - 1e-3), "an accelerator is left idle"
    if cap is not None:
        assert plan.concurrency <= cap
    usable_cpus = any(n.cpus >= 0.001 for n in nodes)
    if not has_gpu and usable_cpus:
        assert plan.concurrency >= min(want, cap or want), "CPU-only cluster below the minimum concurrency"
        assert all(s.cpus > 0 for s in plan.slots)
    assert plan.threads_per_trial >= 1


def test_replanning_after_a_node_dies_never_overbooks_the_survivors():
    from aiperf.cluster.pool import _fitting

    head, a, b = node("head", 0, head=True), node("a", 1), node("b", 1)
    before = plan_for([head, a, b])
    held = [s for s in before.slots if s.node_id == "a-id"]  # b died; a's worker holds its whole CPU
    after = plan_for([head, a])  # one node left: the plan now splits a's core between two trials
    assert [s.cpus for s in after.slots] == [0.5, 0.5]
    missing = [s for s in after.slots if (s.node_id, s.index) not in {(h.node_id, h.index) for h in held}]
    assert missing and _fitting(missing, held, [head, a]) == [], "a worker that can never be scheduled"
    c = node("c", 1)  # a node joins: its slot fits
    joined = plan_for([head, a, c])
    new = [s for s in joined.slots if s.node_id == "c-id"]
    assert _fitting(new, held, [head, a, c]) == new


# -- compiling ahead: on where a host core is free to compile, off where every core trains -----------------------
def test_compile_ahead_auto_is_off_where_every_core_of_a_cpu_box_trains():
    plan = plan_for([node("box", 2)])
    assert plan.compile_ahead is False
    assert "every core trains a trial" in format_plan(plan)
    assert plan.to_dict()["compile_ahead"] is False


def test_compile_ahead_auto_is_on_where_each_node_keeps_a_core_free():
    # the CPU stand-in for a device: one slot of one core, the other core its host
    plan = plan_for([node("box", 2)], "cluster.max_concurrent_trials=1", "cluster.cpus_per_trial=1")
    assert plan.concurrency == 1 and plan.compile_ahead is True
    assert "compile ahead: on" in format_plan(plan)
    # a capped run whose slot takes every core (cpus_per_trial auto) has none free
    assert plan_for([node("box", 2)], "cluster.max_concurrent_trials=1").compile_ahead is False
    # one node with a free core and one without: the one without would compile on its training cores
    uneven = plan_for([node("a", 3), node("b", 2)], "cluster.cpus_per_trial=1", "cluster.max_concurrent_trials=4")
    assert per_node(uneven) == Counter({"a-id": 2, "b-id": 2}) and uneven.compile_ahead is False


def test_compile_ahead_auto_is_on_for_accelerators_and_an_explicit_setting_wins():
    assert plan_for([node("gpu", 16, 8)]).compile_ahead is True
    assert plan_for([node("gpu", 16, 8)], "train.compile_ahead=false").compile_ahead is False
    forced = plan_for([node("box", 2)], "train.compile_ahead=true")
    assert forced.compile_ahead is True and "train.compile_ahead" in format_plan(forced)


def test_the_plan_s_choice_reaches_every_worker():
    from aiperf.cluster.worker import WorkerSettings

    cfg = load_config("smoke", ["cluster.max_concurrent_trials=1", "cluster.cpus_per_trial=1"])
    assert WorkerSettings.from_config(cfg, make_plan([node("box", 2)], cfg)).compile_ahead is True
    assert WorkerSettings.from_config(cfg, make_plan([node("box", 1)], cfg)).compile_ahead is False
    assert WorkerSettings.from_config(cfg).compile_ahead is False  # no plan (an audit's re-training): "auto" is off

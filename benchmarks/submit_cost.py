"""What one trial submission costs the master on Ray: serialising the spec, and the remote call.

The master submits every trial with ``actor.run_trial.remote(spec, ...)``; Ray serialises the
arguments in the caller's thread. This times Ray's own serialisation context and a remote call
carrying the spec, with the spec as the master sends it (plain JSON values) and with the graph's
kept node documents (``NodeDoc``, a dict subclass) as it sent them before 2026-11-27.

    PYTHONPATH=. python benchmarks/submit_cost.py [--calls 3000]

Then the submission as the pool makes it, a streaming-generator method of an actor, with the
calling thread's CPU time apart from the wall time; and one call carrying ``--batch`` trials'
specs (as a node agent taking its node's trials in one call would), set against as many single
calls. Starts a one-CPU local Ray (loopback only) and stops it; results in
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from aiperf.families.image.family import ImageFamily
from nas import zoo
from nas.serialize import graph_to_dict


def _spec(graph: dict[str, Any]) -> dict[str, Any]:
    hparams = {"batch_size": 64.0, "epochs": 5.0, "learning_rate": 0.01, "dropout": 0.2}
    return {
        "trial_id": "t00001",
        "kind": "arch",
        "graph": graph,
        "hparams": hparams,
        "seed": 1,
        "parent_graph": None,
        "morphs": [],
        "attempt": 0,
        "start_epoch": 0,
        "checkpoint_every_epoch": True,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000, help="serialisations and remote calls timed per kind of spec")
    p.add_argument("--batch", type=int, default=8, help="trials one batched call carries (a node's accelerators)")
    args = p.parse_args()
    if not 10 <= args.calls <= 1_000_000:
        p.error("--calls must be in [10, 1000000]")
    if not 1 <= args.batch <= 1024:
        p.error("--batch must be in [1, 1024]")

    import ray

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        context = ray._private.worker.global_worker.get_serialization_context()

        @ray.remote
        def receive(spec: dict[str, Any]) -> int:
            return len(spec)

        graph = zoo.small_resnet((28, 28, 1), 10, width=16)  # the scale simulation's seed
        print(f"{'spec':<30} {'serialise_us':>12} {'remote_call_us':>14}")
        for name, doc in (
            ("NodeDoc nodes (before)", graph_to_dict(graph)),
            ("plain dicts (as sent now)", ImageFamily().arch_dict(graph)),
        ):
            spec = _spec(doc)
            t0 = time.perf_counter()
            for _ in range(args.calls):
                context.serialize(spec)
            serialise_us = (time.perf_counter() - t0) / args.calls * 1e6
            ray.get([receive.remote(spec) for _ in range(min(300, args.calls))])  # warm the worker
            t0 = time.perf_counter()
            refs = [receive.remote(spec) for _ in range(args.calls)]
            call_us = (time.perf_counter() - t0) / args.calls * 1e6  # the submissions only, not their execution
            ray.get(refs)
            print(f"{name:<30} {serialise_us:>12.1f} {call_us:>14.1f}")
        _actor_calls(ray, _spec(ImageFamily().arch_dict(graph)), args.calls, args.batch)
    finally:
        ray.shutdown()


def _actor_calls(ray: Any, spec: dict[str, Any], calls: int, batch: int) -> None:
    """A trial's submission as the pool makes it: a streaming-generator method of an actor.

    Timed three ways per call: wall time, the calling thread's CPU time (what holds up the
    master's fill loop, which submits from one thread) and the whole driver process's CPU time
    (Ray's own threads beside it, which a head node with spare cores runs in parallel). Then
    the same trials submitted ``batch`` to a call, as a node agent could take them.
    """

    @ray.remote
    class Runner:
        def run_trial(self, spec: dict[str, Any], parent: Any, resume: Any) -> Any:
            yield len(spec)

        def run_trials(self, items: list[tuple[int, dict[str, Any], Any, Any]]) -> Any:
            for index, _spec, _parent, _resume in items:
                yield index

    runner = Runner.remote()
    gens = [runner.run_trial.remote(spec, None, None) for _ in range(min(300, calls))]  # warm the actor
    for gen in gens:
        ray.get(next(gen))
    wall0, thread0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
    gens = [runner.run_trial.remote(spec, None, None) for _ in range(calls)]
    wall, thread = time.perf_counter() - wall0, time.thread_time() - thread0
    process = time.process_time() - process0
    for gen in gens:
        ray.get(next(gen))
    print(
        f"actor streaming call (plain dicts): wall {wall / calls * 1e6:.1f} us, calling thread's CPU"
        f" {thread / calls * 1e6:.1f} us, driver process's CPU {process / calls * 1e6:.1f} us a call"
    )
    rounds = max(1, calls // batch)
    items = [(k, spec, None, None) for k in range(batch)]
    wall0, thread0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
    gens = [runner.run_trials.remote(items) for _ in range(rounds)]
    wall, thread = time.perf_counter() - wall0, time.thread_time() - thread0
    process = time.process_time() - process0
    for gen in gens:
        ray.get(next(gen))
    trials = rounds * batch
    print(
        f"one call carrying {batch} trials: wall {wall / rounds * 1e6:.1f} us, calling thread's CPU"
        f" {thread / rounds * 1e6:.1f} us a call, {thread / trials * 1e6:.1f} us a trial;"
        f" driver process's CPU {process / trials * 1e6:.1f} us a trial"
    )


if __name__ == "__main__":
    main()

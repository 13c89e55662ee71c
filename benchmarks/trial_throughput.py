"""How close the trainer comes to a plain, hand-written training loop on the same device.

For each architecture -- the seed (``small_resnet``), ResNet-50, and a "searched" net (the
seed after six random morphs, fixed RNG seed) -- three things train the same Keras model
(``aiperf.families.image.model.build_model``) at the same batch size and precision:

* **reference**: a minimal compiled training step written by hand -- JAX:
  ``model.stateless_call`` + ``jax.value_and_grad`` + an SGD/Nesterov update, ``jax.jit``
  with donated state; TensorFlow: a ``GradientTape`` step in ``tf.function`` (XLA per
  ``--jit``). Batches live on the device; compile time is excluded; median of ``--reps``.
* **trainer**: ``TrialRunner.run`` on a synthetic in-memory dataset of ``--steps`` batches,
  exactly as a worker trains a trial. Steady state = epochs 2.. (the first holds the
  compile); reported with and without the first epoch, plus start-up (build + compile).
* **fit**: (diagnostic) plain ``model.fit`` epochs of the trainer's compiled model -- arrays,
  arrays with a batch-end callback, and (TensorFlow) a tf.data pipeline without autotuning --
  to show what Keras's loop, a per-step callback and tf.data's autotuner cost.

Counted TFLOP/s use the engine's analytic count, ``count_flops(graph).train_per_image(batch)``,
so they are the figures the benchmark score would credit. Target: trainer >= 90 % of reference.

On a GPU host (JAX, bf16, ResNet-50 at 224x224, batch 256 by default)::

    KERAS_BACKEND=jax PYTHONPATH=/tmp/site312:. python benchmarks/trial_throughput.py --json out.json

On a small CPU (TensorFlow, float32, ResNet-50 at 64x64)::

    PYTHONPATH=. python benchmarks/trial_throughput.py --backend tensorflow
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import time
from typing import Any

import common

HPARAMS = {"learning_rate": 0.05, "weight_decay": 5e-4, "dropout": 0.0, "kernel_size": 3}
MOMENTUM = 0.9
GPU_DEFAULTS = {
    "image": {"seed": 32, "searched": 32, "resnet50": 224},
    "batch": {"seed": 256, "searched": 256, "resnet50": 256},
    "steps": {"seed": 80, "searched": 80, "resnet50": 50},
    "epochs": 4,
}
CPU_DEFAULTS = {
    "image": {"seed": 32, "searched": 32, "resnet50": 64},
    "batch": {"seed": 64, "searched": 64, "resnet50": 32},
    "steps": {"seed": 32, "searched": 16, "resnet50": 8},
    "epochs": 4,
}


# -- the reference loops ----------------------------------------------------------------------------
class JaxReference:
    """Hand-written jitted step: stateless forward/backward, SGD with Nesterov momentum and weight decay."""

    def __init__(self, model: Any, batches: list[tuple[Any, Any]]) -> None:
        import jax
        import jax.numpy as jnp

        lr, wd = HPARAMS["learning_rate"], HPARAMS["weight_decay"]

        def loss_fn(trainable: list, non_trainable: list, x: Any, y: Any) -> tuple[Any, list]:
            logits, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
            logp = jax.nn.log_softmax(logits.astype(jnp.float32))
            return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1)), non_trainable

        def step(state: tuple, x: Any, y: Any) -> tuple[tuple, Any]:
            trainable, non_trainable, velocity = state
            (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, non_trainable, x, y)
            velocity = [MOMENTUM * v - lr * g for v, g in zip(velocity, grads, strict=True)]
            trainable = [
                w * (1.0 - lr * wd) + MOMENTUM * v - lr * g for w, v, g in zip(trainable, velocity, grads, strict=True)
            ]
            return (trainable, non_trainable, velocity), loss

        self._step = jax.jit(step, donate_argnums=0)
        trainable = [jnp.array(v.value) for v in model.trainable_variables]  # copies: donation must not free Keras's
        self._state = (
            trainable,
            [jnp.array(v.value) for v in model.non_trainable_variables],
            [jnp.zeros_like(w) for w in trainable],
        )
        self._batches = [(jax.device_put(x), jax.device_put(y.astype("int32"))) for x, y in batches]
        self.loss: Any = None

    def timed(self, steps: int) -> float:
        """Seconds for ``steps`` steps, dispatched back to back, ending when the last one is done."""
        t = time.perf_counter()
        for i in range(steps):
            self._state, self.loss = self._step(self._state, *self._batches[i % len(self._batches)])
        self.loss.block_until_ready()
        return time.perf_counter() - t


class TensorflowReference:
    """Hand-written ``tf.function`` GradientTape step with the same update as the JAX reference."""

    def __init__(self, model: Any, batches: list[tuple[Any, Any]], jit: bool) -> None:
        import tensorflow as tf

        lr, wd = HPARAMS["learning_rate"], HPARAMS["weight_decay"]
        weights = model.trainable_variables
        velocity = [tf.Variable(tf.zeros(w.shape, w.dtype), trainable=False) for w in weights]

        @tf.function(jit_compile=jit)
        def train_step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                logits = tf.cast(model(x, training=True), tf.float32)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            grads = tape.gradient(loss, weights)
            for w, v, g in zip(weights, velocity, grads, strict=True):
                v.assign(MOMENTUM * v - lr * g)
                w.assign(w * (1.0 - lr * wd) + MOMENTUM * v - lr * g)
            return loss

        self._step = train_step
        self._batches = [(tf.constant(x), tf.constant(y.astype("int32"))) for x, y in batches]
        self.loss: Any = None

    def timed(self, steps: int) -> float:
        t = time.perf_counter()
        for i in range(steps):
            self.loss = self._step(*self._batches[i % len(self._batches)])
        self.loss.numpy()
        return time.perf_counter() - t


def make_reference(
    graph: Any,
    dataset: Any,
    precision: str,
    jit: bool,
    batch: int,
    backend: str,
) -> tuple[Any, dict[str, float]]:
    """The reference loop for the same net and precision, compiled and warmed up; returns it and its set-up times."""
    from aiperf.families.image.model import build_model

    t0 = time.perf_counter()
    model = build_model(
        graph, dtype_policy=precision, pixel_scale=dataset.pixel_scale, pixel_offset=dataset.pixel_offset
    )
    build_s = time.perf_counter() - t0
    batches = [
        (dataset.x_train[k * batch : (k + 1) * batch], dataset.y_train[k * batch : (k + 1) * batch]) for k in range(2)
    ]
    if backend == "jax":
        loop: Any = JaxReference(model, batches)
    elif backend == "tensorflow":
        loop = TensorflowReference(model, batches, jit)
    else:
        raise SystemExit(f"the reference loop exists for jax and tensorflow, not {backend}")
    compile_s = loop.timed(1)
    loop.timed(3)  # warm-up: allocator, autotuning
    return loop, {"build_s": build_s, "compile_s": compile_s}


# -- the engine -------------------------------------------------------------------------------------
def trainer_summary(items: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Split a trial's time into start-up, the compile-holding first epoch, steady epochs and the rest."""
    epochs = [i for i in items if i["type"] == "epoch"]
    done = items[-1]
    steady = epochs[1:]
    images = sum(e["train_images"] for e in epochs)
    busy = sum(e["train_s"] + e["eval_s"] for e in epochs)
    return {
        "startup_s": done["startup_s"],
        "first_step_s": done["first_step_s"],
        "first_epoch_s": epochs[0]["train_s"],
        "epoch_s": [e["train_s"] for e in epochs],
        "eval_s": [e["eval_s"] for e in epochs],
        "train_loss": [e["train_loss"] for e in epochs],  # a diverging loss (inf/NaN) can change the speed
        "epoch_images_per_s": [e["train_images"] / e["train_s"] for e in steady],
        "images_per_s": common.median([e["train_images"] / e["train_s"] for e in steady]),
        "images_per_s_with_first_epoch": images / sum(e["train_s"] for e in epochs),
        "images_per_s_with_startup": images / (done["startup_s"] + sum(e["train_s"] for e in epochs)),
        "eval_images_per_s": common.median([e["eval_images"] / e["eval_s"] for e in steady]),
        "trial_wall_s": wall,
        "outside_steps_s": wall - busy - done["startup_s"],  # weight copies, metrics, generator hand-offs
        "precision": done["precision"],
    }


def fit_epoch_rate(model: Any, dataset: Any, batch: int, callbacks: list, tf_input: Any = None) -> float:
    """Images/s of one ``model.fit`` epoch of an already compiled model (arrays, or a tf.data pipeline)."""
    t0 = time.perf_counter()
    if tf_input is not None:
        model.fit(tf_input, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)  # it reshuffles itself
    else:
        model.fit(
            dataset.x_train, dataset.y_train, batch_size=batch, epochs=1, shuffle=True, verbose=0, callbacks=callbacks
        )
    return dataset.train_size / (time.perf_counter() - t0)


def tf_epoch_input(x: Any, y: Any, batch: int, seed: int = 0) -> Any:
    """A reshuffling tf.data pipeline over resident arrays with tf.data autotuning off.

    Keras turns NumPy arrays into a pipeline whose autotuner thread wakes after 10 ms and
    then at doubling intervals (to 60 s); destroying the iterator at the end of ``fit`` waits
    for its next wake-up, so every ``fit`` call lasts until 2.55, 5.1, 10.2, 20.5, 41 s...
    after it started. Without autotuning that wait is gone (RESULTS.md, "tf.data stall").
    """
    import tensorflow as tf

    n = len(y)
    images, labels = tf.constant(x), tf.constant(y)
    pipeline = (
        tf.data.Dataset.range(n)
        .shuffle(n, seed=seed, reshuffle_each_iteration=True)
        .batch(batch)
        .map(lambda i: (tf.gather(images, i), tf.gather(labels, i)))
        .prefetch(1)
    )
    options = tf.data.Options()
    options.autotune.enabled = False
    return pipeline.with_options(options)


def batch_end_callback() -> Any:
    """A callback that only overrides ``on_train_batch_end`` -- as the trainer's first-step timer does.

    Keras then converts every step's logs to Python floats on the main thread (a device sync
    per step) instead of dispatching callbacks asynchronously.
    """
    import keras

    class BatchEnd(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            pass

    return BatchEnd()


# -- one architecture -------------------------------------------------------------------------------
def fit_variants(model: Any, dataset: Any, batch: int, backend: str, rounds: int = 3) -> dict[str, Any]:
    """Plain ``model.fit`` epochs of the trial's compiled model, in alternation: what Keras's loop costs.

    Variants: arrays (as the trainer feeds them), arrays with a batch-end callback (as the
    trainer's first-step timer has), and on TensorFlow a tf.data pipeline without autotuning.
    """
    fit_epoch_rate(model, dataset, batch, [])  # the first fit after the trial may re-trace
    tf_input = tf_epoch_input(dataset.x_train, dataset.y_train, batch) if backend == "tensorflow" else None
    runs: dict[str, list[float]] = {"images_per_s": [], "batch_end_callback_images_per_s": []}
    if tf_input is not None:
        runs["tf_data_no_autotune_images_per_s"] = []
    for _ in range(rounds):
        runs["images_per_s"].append(fit_epoch_rate(model, dataset, batch, []))
        runs["batch_end_callback_images_per_s"].append(fit_epoch_rate(model, dataset, batch, [batch_end_callback()]))
        if tf_input is not None:
            runs["tf_data_no_autotune_images_per_s"].append(fit_epoch_rate(model, dataset, batch, [], tf_input))
    return {**{k: common.median(v) for k, v in runs.items()}, "all": runs}


def paired_runs(
    runner: Any,
    spec: Any,
    reference_setup: Any,
    steps: int,
    batch: int,
    reps: int,
    interleave: bool,
) -> tuple[list[dict[str, Any]], float, list[float], dict[str, float]]:
    """Train the trial and time the reference; returns (trial items, trial wall s, reference images/s, set-up).

    ``interleave`` (the default): one reference timing before each steady epoch, so a shared
    machine's drifting load hits both alike; the paired ratio is the figure to compare. Otherwise
    the reference is timed ``reps`` times and freed before the trial starts. (A second live model
    once made TensorFlow's ``fit`` stall after its last step; that was tf.data's autotuner, which
    the trainer's own input no longer runs: RESULTS.md.)
    """
    rates: list[float] = []
    if not interleave:
        reference, setup = reference_setup()
        rates = [steps * batch / reference.timed(steps) for _ in range(reps)]
        del reference
        gc.collect()
    trial = runner.run(spec)
    t0 = time.perf_counter()
    items = [next(trial)]  # build, compile, first epoch, first evaluation
    wall = time.perf_counter() - t0
    if interleave:
        reference, setup = reference_setup()
        for _ in range(int(spec.hparams["epochs"]) - 1):
            rates.append(steps * batch / reference.timed(steps))
            t0 = time.perf_counter()
            items.append(next(trial))
            wall += time.perf_counter() - t0
    t0 = time.perf_counter()
    items.extend(trial)  # the remaining epochs and the "done" record
    wall += time.perf_counter() - t0
    if interleave:
        while len(rates) < reps:
            rates.append(steps * batch / reference.timed(steps))
        del reference
    return items, wall, rates, setup


def measure(
    arch: str,
    args: argparse.Namespace,
    kind: str,
    precision: str,
    jit: Any,
    device_memory: int,
) -> dict[str, Any]:
    import keras

    from aiperf.families.image.flops import count_flops
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner, activation_bytes, batch_limit
    from aiperf.training.trial import TrialSpec

    defaults = GPU_DEFAULTS if kind == "gpu" else CPU_DEFAULTS
    size = args.image_size or defaults["image"][arch]
    classes = args.classes or (1000 if arch == "resnet50" else 10)
    graph = common.benchmark_net(arch, size, classes=classes, width=args.width)
    requested = args.batch_size or defaults["batch"][arch]
    batch = min(requested, batch_limit(activation_bytes(graph, precision), device_memory, requested))
    steps = args.steps or defaults["steps"][arch]
    epochs = max(2, args.epochs or defaults["epochs"])
    cost = count_flops(graph)
    train_flop, eval_flop = cost.train_per_image(batch), cost.eval_per_image
    val = args.val_images or (512 if kind == "gpu" else 2 * batch)
    dataset = common.synthetic_dataset((size, size, 3), classes, batch * steps + args.remainder, val)
    print(
        f"[{arch}] {size}x{size}x3, {classes} classes, {graph.param_count:,} params, "
        f"{train_flop / 1e9:.3g} GFLOP/image train, batch {batch}, {steps} steps/epoch, {epochs} epochs; "
        f"{common.load_note()}",
        flush=True,
    )
    result: dict[str, Any] = {
        "arch": arch,
        "image_size": size,
        "classes": classes,
        "params": graph.param_count,
        "batch_size": batch,
        "steps_per_epoch": steps,
        "remainder_images": args.remainder,
        "interleaved": args.interleave is not False,
        "epochs": epochs,
        "train_flop_per_image": train_flop,
        "eval_flop_per_image": eval_flop,
        "layers": len(graph.nodes),
        "load_before": common.load_note(),
    }
    settings = TrainerSettings(
        precision=precision, jit_compile=jit, momentum=MOMENTUM, device_memory_bytes=device_memory
    )
    runner = TrialRunner(dataset, settings)
    spec = TrialSpec("bench", "seed", graph.to_dict(), dict(HPARAMS, batch_size=batch, epochs=epochs), seed=1)
    interleave = args.interleave is not False
    items, wall, ref_rates, setup = paired_runs(
        runner,
        spec,
        lambda: make_reference(graph, dataset, precision, bool(jit), batch, args.backend),
        steps,
        batch,
        args.reps,
        interleave,
    )
    trainer = trainer_summary(items, wall)
    ref = common.median(ref_rates)
    paired = [m / r for m, r in zip(trainer["epoch_images_per_s"], ref_rates, strict=False)] if interleave else []
    result["reference"] = {**setup, "images_per_s": ref, "images_per_s_all": ref_rates}
    result["trainer"] = trainer
    result["ratio"] = trainer["images_per_s"] / ref
    result["ratio_paired_median"] = common.median(paired) if paired else None
    result["ratio_with_first_epoch"] = trainer["images_per_s_with_first_epoch"] / ref
    result["reference_flop_per_s"] = ref * train_flop
    result["trainer_flop_per_s"] = trainer["images_per_s"] * train_flop
    print(
        f"  reference: {ref:.1f} img/s ({common.si(ref * train_flop, 'FLOP/s')}), compile {setup['compile_s']:.2f} s;"
        f" rounds {', '.join(f'{r:.0f}' for r in ref_rates)}",
        flush=True,
    )
    print(
        f"  trainer:   {trainer['images_per_s']:.1f} img/s steady = {100 * result['ratio']:.1f} % of reference "
        f"(paired {100 * (result['ratio_paired_median'] or math.nan):.1f} %); "
        f"{trainer['images_per_s_with_first_epoch']:.1f} img/s with the first epoch; "
        f"start-up {trainer['startup_s']:.2f} s + first step {trainer['first_step_s'] or math.nan:.2f} s; rounds "
        f"{', '.join(f'{r:.0f}' for r in trainer['epoch_images_per_s'])}",
        flush=True,
    )
    if args.fit_variants:
        result["fit"] = fit_variants(runner.last_model, dataset, batch, args.backend)
        fit = result["fit"]
        print(
            f"  fit:       {fit['images_per_s']:.1f} img/s plain, {fit['batch_end_callback_images_per_s']:.1f} img/s "
            "with a batch-end callback"
            + (
                f", {fit['tf_data_no_autotune_images_per_s']:.1f} img/s from tf.data without autotuning"
                if "tf_data_no_autotune_images_per_s" in fit
                else ""
            ),
            flush=True,
        )
    runner.last_model = None
    keras.backend.clear_session()
    gc.collect()
    result["load_after"] = common.load_note()
    return result


def warm_up(precision: str, jit: Any, device_memory: int) -> dict[str, float]:
    """Train one tiny trial first, so the measured trials do not pay the process's one-time framework start.

    A worker pays that once, on its first trial; every later trial pays only its own build
    and compile, which is what the per-architecture start-up figures should show.
    """
    from aiperf.families.image.trainer import TrainerSettings, TrialRunner
    from aiperf.training.trial import TrialSpec

    dataset = common.synthetic_dataset((8, 8, 3), 10, 64, 32)
    graph = common.benchmark_net("seed", 8, width=4)
    settings = TrainerSettings(precision=precision, jit_compile=jit, device_memory_bytes=device_memory)
    runner = TrialRunner(dataset, settings)
    spec = TrialSpec("warm", "seed", graph.to_dict(), dict(HPARAMS, batch_size=32, epochs=1), seed=0)
    t0 = time.perf_counter()
    done = list(runner.run(spec))[-1]
    return {"wall_s": time.perf_counter() - t0, "startup_s": done["startup_s"], "first_step_s": done["first_step_s"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "tensorflow"), choices=("jax", "tensorflow"))
    p.add_argument("--threads", type=int, default=common.cores(), help="framework threads (CPU)")
    p.add_argument("--precision", default="auto", help="auto | float32 | mixed_bfloat16 | mixed_float16")
    p.add_argument("--jit", default="auto", choices=("auto", "on", "off"), help="XLA for the trainer and the reference")
    p.add_argument("--arch", default=",".join(common.ARCHS), help="comma list of seed, resnet50, searched")
    p.add_argument(
        "--image-size", type=int, default=None, help="default: 32 (seed, searched); ResNet-50 224 GPU, 64 CPU"
    )
    p.add_argument("--batch-size", type=int, default=None, help="default: 256 on GPU; 64 (32 for ResNet-50) on CPU")
    p.add_argument("--steps", type=int, default=None, help="steps per trainer epoch and per reference timing")
    p.add_argument("--epochs", type=int, default=None, help="trainer epochs (the first holds the compile)")
    p.add_argument("--reps", type=int, default=3, help="reference timings (median)")
    p.add_argument("--classes", type=int, default=None, help="default 10; 1000 for ResNet-50")
    p.add_argument("--width", type=int, default=32, help="seed width (the synthetic config's)")
    p.add_argument("--val-images", type=int, default=None)
    p.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="alternate reference timings and trainer epochs (default: on; the paired ratio is the robust figure)",
    )
    p.add_argument(
        "--remainder",
        type=int,
        default=0,
        help="extra training images past the last full batch (a ragged last step, as real datasets have)",
    )
    p.add_argument("--no-fit-variants", dest="fit_variants", action="store_false", help="skip the plain-fit diagnostic")
    p.add_argument(
        "--peak",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure the matmul peak (default: on for GPU)",
    )
    p.add_argument("--json", default=None, metavar="OUT")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.configure_backend(args.backend, args.threads)
    from aiperf.training.backend import choose_jit, choose_precision, describe_device

    device = describe_device(args.backend)
    precision = choose_precision(args.precision, device)
    if args.backend == "jax" and precision == "mixed_float16":
        raise SystemExit("the JAX reference loop has no loss scaling: use float32 or mixed_bfloat16")
    jit = choose_jit(args.jit, args.backend, device)
    memory = device.memory_bytes if device.kind == "gpu" else 0
    facts = common.machine_facts()
    print(
        f"trial_throughput: {args.backend} on {device.kind} ({device.name}), {precision}, jit {jit}, "
        f"{args.threads} threads; {facts['date']}; {facts['load']}",
        flush=True,
    )
    out: dict[str, Any] = {
        "facts": facts,
        "backend": args.backend,
        "device": device.to_dict(),
        "precision": precision,
        "jit": jit,
        "threads": args.threads,
        "results": [],
    }
    out["first_trial_in_process"] = warm_up(precision, jit, memory)
    print(f"first (warm-up) trial in this process: {out['first_trial_in_process']}", flush=True)
    for arch in [a.strip() for a in args.arch.split(",") if a.strip()]:
        out["results"].append(measure(arch, args, device.kind, precision, jit, memory))
        common.write_json(args.json, out)
    if args.peak if args.peak is not None else device.kind == "gpu":
        peak = (
            common.jax_matmul_peak()
            if args.backend == "jax" and device.kind == "gpu"
            else common.cpu_matmul_peak(args.threads)
        )
        out["matmul_peak"] = peak
        for r in out["results"]:
            r["reference_fraction_of_peak"] = r["reference_flop_per_s"] / peak["peak"]
            r["trainer_fraction_of_peak"] = r["trainer_flop_per_s"] / peak["peak"]
    _print_table(out)
    common.write_json(args.json, out)
    return out


def _print_table(out: dict[str, Any]) -> None:
    peak = out.get("matmul_peak", {}).get("peak")
    print(
        f"\n{'arch':9} {'batch':>5} {'ref img/s':>10} {'ours img/s':>10} {'ratio':>6} {'w/ 1st ep':>9} "
        f"{'ours FLOP/s':>12} {'startup':>8} {'1st step':>8}" + ("  % peak" if peak else "")
    )
    for r in out["results"]:
        t = r["trainer"]
        line = (
            f"{r['arch']:9} {r['batch_size']:>5} {r['reference']['images_per_s']:>10.1f} "
            f"{t['images_per_s']:>10.1f} {r['ratio']:>6.3f} {r['ratio_with_first_epoch']:>9.3f} "
            f"{common.si(r['trainer_flop_per_s'], 'FLOP/s'):>12} {t['startup_s']:>7.2f}s "
            f"{(t['first_step_s'] or math.nan):>7.2f}s"
        )
        if peak:
            line += f"  {100 * r['trainer_fraction_of_peak']:.1f} %"
        print(line)
    if peak:
        print(f"matmul peak: {common.si(peak, 'FLOP/s')} ({out['matmul_peak']})")


if __name__ == "__main__":
    main()

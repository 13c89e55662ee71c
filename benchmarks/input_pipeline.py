"""Can the streamed input feed the trainer? Decode + augment throughput, and the trainer streamed vs resident.

On an ImageNet-like tree (written by ``aiperf make-imagenet``: JPEGs around 110 KB, its quirks
included), at 224x224 by default:

1. **decode + augment**: the pipeline the workers run (``aiperf.families.image.stream_input.TrainStream``:
   read, fused JPEG crop-decode, random-resized crop, resize, flip, batch) drained without a
   model, with 1, 2, ... decode threads: images/s and images/s per core. Reference, in the same
   run: one core decoding the same files with Pillow and cropping/flipping with NumPy in a plain
   Python loop (Pillow's full decode, a NumPy random-resized crop window, Pillow's bilinear resize).
2. **trainer, streamed vs resident**: ``TrialRunner`` training the same images at the same size,
   once streamed (``dataset.storage=stream``, ``--trainer-threads`` decode threads) and once held
   in memory (``dataset.storage=memory``), alternating ABBA over ``--reps``: steady-state images/s
   (epochs 2..), their ratio (target >= 0.9 when the decode threads suffice) and the share of
   step time the loop waited for input.
3. **cores per GPU**: from the best per-core decode rate, the cores needed to feed one GPU at the
   rates in ``--gpu-rates`` (ResNet-50 @224 on one H100 trains 4,000-5,600 images/s with plain
   Keras/JAX and torch.compile loops; shared/README.md).

CPU box (small net; ResNet-50 at 224 trains a few images/s on 2 cores)::

    PYTHONPATH=. python benchmarks/input_pipeline.py --json input.json

GPU host (JAX, ResNet-50 at 224, batch 256)::

    KERAS_BACKEND=jax PYTHONPATH=/tmp/site312:. python benchmarks/input_pipeline.py --backend jax --arch resnet50 \\
        --train-batch 256 --json $OUT/input.json

A tiny smoke check of the script itself (seconds)::

    PYTHONPATH=. python benchmarks/input_pipeline.py --classes 2 --per-class 8 --size 64 --threads 1 \\
        --epochs 2 --reps 1 --max-side 128
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import numpy as np

HPARAMS = {"learning_rate": 0.05, "weight_decay": 5e-5, "dropout": 0.0, "kernel_size": 3}
GPU_RATES = (4000.0, 5600.0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", default=None, help="an ImageNet-layout folder to read (default: generate one)")
    p.add_argument("--work", default=None, help="where to generate the tree (default: a temporary folder)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=100, help="training images per class to generate")
    p.add_argument("--max-side", type=int, default=1024, help="largest generated image side")
    p.add_argument("--size", type=int, default=224, help="training image size (square)")
    p.add_argument("--threads", default=None, help="decode thread counts to measure, e.g. 1,2,4 (default 1..cores)")
    p.add_argument("--batch", type=int, default=64, help="batch size of the decode measurement")
    p.add_argument("--passes", type=int, default=2, help="epochs drained per thread count (best is kept)")
    p.add_argument("--backend", default=os.environ.get("KERAS_BACKEND", "tensorflow"))
    p.add_argument("--arch", default=None, help="seed | resnet50 | searched (default: resnet50 on GPU, else seed)")
    p.add_argument("--train-batch", type=int, default=None, help="trainer batch (default 256 on GPU, else 32)")
    p.add_argument("--trainer-threads", type=int, default=None, help="decode threads of the streamed trainer")
    p.add_argument("--epochs", type=int, default=3, help="trainer epochs per measurement (the first holds compile)")
    p.add_argument("--reps", type=int, default=2, help="ABBA repetitions of resident/streamed trainer runs")
    p.add_argument("--gpu-rates", default=",".join(str(int(r)) for r in GPU_RATES))
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


# -- the data ---------------------------------------------------------------------------------------
def prepare_tree(args: argparse.Namespace) -> Path:
    if args.tree:
        return Path(args.tree)
    from aiperf.datasets.generate import GenerateSpec, generate_imagenet

    work = Path(args.work or tempfile.mkdtemp(prefix="aiperf-input-"))
    tree = work / "imagenet"
    if not tree.exists():
        spec = GenerateSpec(
            classes=args.classes,
            train_per_class=args.per_class,
            val_per_class=max(2, args.per_class // 10),
            max_side=args.max_side,
            min_side=min(64, args.max_side),
        )
        t0 = time.perf_counter()
        manifest = generate_imagenet(tree, spec)
        print(
            f"generated {manifest['train_images']} + {manifest['val_images']} images, mean "
            f"{manifest['mean_bytes'] / 1024:.1f} KB, in {time.perf_counter() - t0:.1f} s: {tree}",
            flush=True,
        )
    return tree


def load(tree: Path, size: int, storage: str) -> Any:
    from aiperf.config import DatasetConfig
    from aiperf.datasets import load_dataset

    cfg = DatasetConfig(
        name="image_folder", path=str(tree), image_size=(size, size), storage=storage, max_bad_fraction=0.05
    )
    return load_dataset(cfg)


# -- 1. decode + augment ----------------------------------------------------------------------------
def pipeline_rate(dataset: Any, threads: int, batch: int, passes: int, backend: str) -> dict[str, Any]:
    """Images/s of the workers' training pipeline drained as fast as it produces, best of ``passes``."""
    from aiperf.families.image.stream_input import TrainStream

    best = 0.0
    batch = max(1, min(batch, dataset.train_size // 4))  # a tiny tree still gives several batches
    for epoch in range(1, passes + 1):
        feed = TrainStream(dataset, batch, seed=1, backend=backend, threads=threads, bad_limit=10**9)
        iterator = iter(feed.fit_kwargs(epoch)["x"])
        next(iterator)  # the pipeline's start (thread pools, first batch) is not the steady rate
        t0 = time.perf_counter()
        images = sum(int(np.shape(x)[0]) for x, _ in iterator)
        if images:
            best = max(best, images / (time.perf_counter() - t0))
    return {"threads": threads, "batch": batch, "images_per_s": best, "images_per_s_per_core": best / threads}


def _crop_window(height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """The ResNet random-resized crop window (area 8-100 %, aspect 3/4-4/3, 10 attempts, else whole)."""
    area = height * width
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    return 0, 0, height, width


def reference_rate(files: list[str], size: int, limit_s: float = 60.0) -> dict[str, Any]:
    """One core: Pillow decode, NumPy crop window and flip, Pillow resize, in a Python loop."""
    from PIL import Image

    rng = np.random.default_rng(0)
    done, skipped = 0, 0
    t0 = time.perf_counter()
    for path in files:
        try:
            with Image.open(path) as img:
                pixels = np.asarray(img.convert("RGB"))
        except Exception:  # undecodable: skipped, as the pipeline does
            skipped += 1
            continue
        top, left, h, w = _crop_window(pixels.shape[0], pixels.shape[1], rng)
        crop = Image.fromarray(pixels[top : top + h, left : left + w]).resize((size, size), Image.Resampling.BILINEAR)
        out = np.asarray(crop)
        if rng.random() < 0.5:
            out = out[:, ::-1]
        done += 1
        if time.perf_counter() - t0 > limit_s:
            break
    elapsed = time.perf_counter() - t0
    return {"images": done, "skipped": skipped, "seconds": elapsed, "images_per_s": done / elapsed}


# -- 2. trainer streamed vs resident ----------------------------------------------------------------
def trainer_rate(dataset: Any, graph: Any, args: argparse.Namespace, settings: Any, seed: int) -> dict[str, Any]:
    from aiperf.families.image.trainer import TrialRunner
    from aiperf.training.trial import TrialSpec

    runner = TrialRunner(dataset, settings, args.backend)
    hp = {**HPARAMS, "batch_size": args.train_batch, "epochs": args.epochs}
    epochs = [e for e in runner.run(TrialSpec("bench", "seed", graph.to_dict(), hp, seed=seed)) if e["type"] == "epoch"]
    steady = epochs[1:] or epochs
    train_s = sum(e["train_s"] for e in steady)
    return {
        "images_per_s": sum(e["train_images"] for e in steady) / train_s,
        "data_wait_fraction": sum(e["data_wait_s"] for e in steady) / train_s,
        "epochs": [{k: e[k] for k in ("epoch", "train_images", "train_s", "data_wait_s", "val_acc")} for e in epochs],
    }


def compare_trainer(tree: Path, args: argparse.Namespace, kind: str) -> dict[str, Any]:
    from aiperf.families.image.trainer import TrainerSettings
    from aiperf.training.backend import choose_jit, choose_precision, describe_device

    device = describe_device(args.backend)
    precision = choose_precision("auto", device)
    resident, streamed = load(tree, args.size, "memory"), load(tree, args.size, "stream")
    graph = common.benchmark_net(args.arch, args.size, classes=streamed.num_classes)
    settings = TrainerSettings(
        precision=precision,
        jit_compile=choose_jit("auto", args.backend, device),
        decode_threads=args.trainer_threads,
        max_bad_fraction=0.05,
        device_memory_bytes=device.memory_bytes if device.kind == "gpu" else 0,
    )
    runs: dict[str, list[dict[str, Any]]] = {"resident": [], "streamed": []}
    order = (["resident", "streamed", "streamed", "resident"] * args.reps)[: 2 * args.reps]
    for k, which in enumerate(order):
        result = trainer_rate(resident if which == "resident" else streamed, graph, args, settings, seed=k)
        runs[which].append(result)
        print(
            f"  trainer {which:9s}: {result['images_per_s']:8.1f} img/s, "
            f"{100 * result['data_wait_fraction']:.1f} % of step time waiting for input",
            flush=True,
        )
    rate = {w: common.median([r["images_per_s"] for r in rs]) for w, rs in runs.items()}
    return {
        "arch": args.arch,
        "batch": args.train_batch,
        "precision": precision,
        "device": device.to_dict(),
        "decode_threads": args.trainer_threads,
        "resident_images_per_s": rate["resident"],
        "streamed_images_per_s": rate["streamed"],
        "streamed_over_resident": rate["streamed"] / rate["resident"],
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cores = common.cores()
    threads = [int(t) for t in args.threads.split(",")] if args.threads else list(range(1, cores + 1))
    args.trainer_threads = args.trainer_threads or cores
    common.configure_backend(args.backend, args.trainer_threads)
    kind = common.device_kind(args.backend)
    args.arch = args.arch or ("resnet50" if kind == "gpu" else "seed")
    args.train_batch = args.train_batch or (256 if kind == "gpu" else 32)
    facts = common.machine_facts()
    print(f"input_pipeline: {args.backend} on {kind}; {facts['date']}; {facts['load']}", flush=True)
    tree = prepare_tree(args)
    out: dict[str, Any] = {"facts": facts, "tree": str(tree), "size": args.size, "backend": args.backend}

    streamed = load(tree, args.size, "stream")
    files = [p for p, _ in streamed.train_files or []]
    out["reference_one_core"] = reference_rate(files, args.size)
    print(f"reference (1 core, Pillow + NumPy loop): {out['reference_one_core']['images_per_s']:.1f} img/s", flush=True)
    out["pipeline"] = []
    for n in threads:
        result = pipeline_rate(streamed, n, args.batch, args.passes, args.backend)
        out["pipeline"].append(result)
        print(
            f"pipeline, {n} decode thread(s): {result['images_per_s']:.1f} img/s = "
            f"{result['images_per_s_per_core']:.1f} per core "
            f"({result['images_per_s_per_core'] / out['reference_one_core']['images_per_s']:.2f} x reference)",
            flush=True,
        )
        common.write_json(args.json, out)
    per_core = max(r["images_per_s_per_core"] for r in out["pipeline"])
    out["cores_per_gpu"] = {
        f"{float(rate):.0f}": math.ceil(float(rate) / per_core) for rate in args.gpu_rates.split(",") if rate.strip()
    }
    for rate, need in out["cores_per_gpu"].items():
        print(f"to feed {rate} img/s (one GPU): {need} cores at {per_core:.1f} img/s per core", flush=True)
    out["trainer"] = compare_trainer(tree, args, kind)
    t = out["trainer"]
    print(
        f"trainer {t['arch']} @{args.size} b{t['batch']}: streamed {t['streamed_images_per_s']:.1f} img/s vs "
        f"resident {t['resident_images_per_s']:.1f} img/s = {t['streamed_over_resident']:.2f} (target >= 0.9)",
        flush=True,
    )
    common.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()

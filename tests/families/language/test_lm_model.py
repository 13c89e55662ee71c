"""TransformerSpec -> Keras LM: equal to the NumPy reference on every backend, weights in and out, training, bf16.

:func:`run_checks` compares the Keras model with ``nas.language.spec.forward`` (float64) for the
seed spec (tied and untied, fused and explicit attention) and for children of chains of
morphs with inherited weights, and checks causality, the weight round trip, save/load and
that a few Adam steps lower the loss. The in-process tests call it on the backend Keras was
imported with (TensorFlow unless ``KERAS_BACKEND`` says otherwise); the other backends run
this file as a script in a subprocess, since Keras fixes its backend at import (as
``test_model_builder`` does with ``tests/backend_check.py``):

    KERAS_BACKEND=jax python tests/families/language/test_lm_model.py

A backend whose package is not importable is skipped with the reason; ``AIPERF_BACKEND_PYTHON``
may name another interpreter (e.g. a virtualenv with JAX and torch) for those subprocesses.

Tolerance: relative error ``max|got - want| / max|want|`` of 2e-4 against the float64
reference. The float32 model's rounding is about 1e-6 relative (measured: under 1e-6 on all
three backends); 2e-4 leaves room for other BLAS/oneDNN kernels and accelerators (TF32
matmuls on GPUs are about 1e-3 per product, so GPUs run the checks with TF32 off) while
still catching any real mismatch (a wrong eps, a missing gain, a non-causal or unscaled
softmax all move logits by 1e-2 or more).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

SKIP = 77
BACKEND_PACKAGES = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
if __name__ == "__main__":  # a subprocess for one backend: skip before importing Keras if it cannot load
    _backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    _package = BACKEND_PACKAGES.get(_backend)
    if _package is None or importlib.util.find_spec(_package) is None:
        print(json.dumps({"backend": _backend, "skipped": f"package {_package or _backend!r} is not importable"}))
        sys.exit(SKIP)

keras = pytest.importorskip("keras")

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script in a subprocess
    sys.path.insert(0, str(REPO))

from aiperf.errors import AiperfError  # noqa: E402
from aiperf.families.language.model import (  # noqa: E402
    build_lm,
    has_fused_attention,
    lm_cross_entropy,
    lm_loss_and_metrics,
    lm_weights_from_keras,
    lm_weights_to_keras,
    next_token_pairs,
)
from nas.language.morph import LMMorph, apply_morph, random_morph  # noqa: E402
from nas.language.spec import TransformerSpec, forward, init_weights, seed_spec  # noqa: E402

TOLERANCE = 2e-4  # relative, float32 model vs float64 reference (see the module docstring)
BF16_TOLERANCE = 5e-2  # relative, mixed_bfloat16 vs float32 (bf16 keeps 8 bits of mantissa: ~4e-3 per rounding)
BACKENDS = ("tensorflow", "jax", "torch")
MAX_CHILD_PARAMS = 3_000_000  # keeps morph chains quick on a CPU
# Every kind of morph at least once, in one chain (wider_model last: it rescales every norm and eps).
ALL_KINDS_CHAIN = (
    LMMorph("deeper", 1),
    LMMorph("wider_mlp", 0, 768),
    LMMorph("more_heads", 2, 6),
    LMMorph("deeper", 0),
    LMMorph("wider_model", None, 192),
)


@contextlib.contextmanager
def float32_matmuls() -> Iterator[None]:
    """Float32 matrix products in full float32 on GPUs, for the duration (the previous setting restored).

    TF32, which TensorFlow and JAX use for float32 products on Ampere and later GPUs by default,
    rounds the inputs to 10 mantissa bits (about 1e-3 relative), more than ``TOLERANCE``; on a
    CPU this changes nothing.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        before = tf.config.experimental.tensor_float_32_execution_enabled()
        tf.config.experimental.enable_tensor_float_32_execution(False)
        try:
            yield
        finally:
            tf.config.experimental.enable_tensor_float_32_execution(before)
    elif backend == "jax":
        import jax

        with jax.default_matmul_precision("highest"):
            yield
    elif backend == "torch":
        import torch

        before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    else:  # pragma: no cover - another Keras backend
        yield


@pytest.fixture(autouse=True)
def _full_float32():
    with float32_matmuls():
        yield


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(1e-12, float(np.max(np.abs(want)))))


def random_weights(spec: TransformerSpec, seed: int) -> dict[str, np.ndarray]:
    """init_weights with random norm gains too (so a morph that mishandles a gain or eps shows)."""
    rng = np.random.default_rng(seed)
    weights = init_weights(spec, rng)
    for name, array in weights.items():
        if array.ndim == 1:
            weights[name] = (1.0 + 0.3 * rng.standard_normal(array.shape)).astype(np.float32)
    return weights


def logits(model, tokens: np.ndarray) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(model(tokens, training=False)), np.float64)


def tiny_spec(tied: bool = True) -> TransformerSpec:
    return TransformerSpec(
        vocab_size=16, seq_len=16, width=16, head_dim=8, heads=(2,), mlp_hidden=(32,), tied_output=tied
    )


def morph_chains(count: int, seed: int) -> list[list[LMMorph]]:
    """The all-kinds chain, then ``count`` random chains of 1-4 morphs from the seed spec (params capped)."""
    rng = np.random.default_rng(seed)
    chains = [list(ALL_KINDS_CHAIN)]
    for _ in range(count):
        spec, chain = seed_spec(), []
        for _ in range(int(rng.integers(1, 5))):
            step = random_morph(spec, rng, accept=lambda s: s.params() <= MAX_CHILD_PARAMS)
            if step is None:
                break
            spec, morph = step
            chain.append(morph)
        chains.append(chain)
    return chains


def train_losses(steps: int = 20, seed: int = 0) -> list[float]:
    """Adam steps on one tiny repeated sequence; the per-step training losses."""
    keras.utils.set_random_seed(seed)
    spec = tiny_spec()
    model = build_lm(spec, init_weights(spec, seed))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    tokens = np.tile(np.arange(8), (4, 2))  # [4, 16]: 0..7 twice
    x, y = next_token_pairs(tokens)
    return [float(np.ravel(model.train_on_batch(x, y))[0]) for _ in range(steps)]


def run_checks(chains: int = 2, seed: int = 0) -> dict:
    """Every check on this process's backend; a JSON-ready report whose ``failures`` must be empty."""
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    report: dict = {
        "backend": keras.backend.backend(),
        "fused_attention_available": has_fused_attention(),
        "errors": {},
        "failures": [],
    }

    def check(name: str, err: float, tolerance: float = TOLERANCE) -> None:
        report["errors"][name] = err
        if not err <= tolerance:
            report["failures"].append(f"{name}: relative error {err:.2e} > {tolerance}")

    tokens = rng.integers(0, 256, (2, 48))
    for tied in (True, False):
        spec = replace(seed_spec(), tied_output=tied)
        weights = random_weights(spec, seed)
        want = forward(spec, weights, tokens)
        got = {fused: logits(build_lm(spec, weights, fused_attention=fused), tokens) for fused in (True, False)}
        label = "tied" if tied else "untied"
        check(f"seed_{label}_fused", relative_error(got[True], want))
        check(f"seed_{label}_explicit", relative_error(got[False], want))
        check(f"seed_{label}_fused_vs_explicit", relative_error(got[True], got[False]))

    for k, chain in enumerate(morph_chains(chains, seed)):
        for tied in (True, False):
            parent = replace(seed_spec(), tied_output=tied)
            weights = random_weights(parent, seed + 1 + k)
            parent_logits = logits(build_lm(parent, weights), tokens)
            want = forward(parent, weights, tokens)
            spec = parent
            for morph in chain:
                spec, weights = apply_morph(spec, morph, weights, rng)
            label = f"chain{k}_{'tied' if tied else 'untied'}"
            report.setdefault("chains", {})[label] = [m.kind for m in chain]
            for fused in (True, False):
                child = logits(build_lm(spec, weights, fused_attention=fused), tokens)
                check(
                    f"{label}_{'fused' if fused else 'explicit'}_vs_keras_parent", relative_error(child, parent_logits)
                )
                check(f"{label}_{'fused' if fused else 'explicit'}_vs_reference", relative_error(child, want))

    spec = seed_spec()
    weights = random_weights(spec, seed)
    for fused in (True, False):
        model = build_lm(spec, weights, fused_attention=fused)
        before = logits(model, tokens)
        changed = tokens.copy()
        changed[:, 30] = (changed[:, 30] + 1) % spec.vocab_size
        after = logits(model, changed)
        label = "fused" if fused else "explicit"
        report["errors"][f"causal_{label}_earlier"] = float(np.max(np.abs(after[:, :30] - before[:, :30])))
        if not np.allclose(after[:, :30], before[:, :30], rtol=0, atol=1e-6):
            report["failures"].append(f"causality ({label}): changing token 30 changed earlier logits")
        if np.allclose(after[:, 30:], before[:, 30:], rtol=0, atol=1e-6):
            report["failures"].append(f"causality ({label}): changing token 30 changed no later logit")

    model = build_lm(spec)
    lm_weights_to_keras(model, weights)
    back = lm_weights_from_keras(model)
    if back.keys() != weights.keys() or not all(np.array_equal(back[n], weights[n]) for n in weights):
        report["failures"].append("weights did not round-trip through lm_weights_to_keras/lm_weights_from_keras")

    for tied in (True, False):
        small = tiny_spec(tied)
        model = build_lm(small, random_weights(small, seed))
        x = rng.integers(0, small.vocab_size, (2, small.seq_len))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "lm.keras")
            model.save(path)
            loaded = keras.saving.load_model(path)
        check(f"saved_{'tied' if tied else 'untied'}", relative_error(logits(loaded, x), logits(model, x)), 0.0)

    spec = seed_spec()
    weights = random_weights(spec, seed)
    reference = logits(build_lm(spec, weights), tokens)
    for fused in (True, False):
        model = build_lm(spec, weights, dtype_policy="mixed_bfloat16", fused_attention=fused)
        out = model(tokens, training=False)
        if keras.backend.standardize_dtype(out.dtype) != "float32":
            report["failures"].append(f"mixed_bfloat16 logits are {out.dtype}, not float32")
        got = keras.ops.convert_to_numpy(out)
        check(f"bf16_{'fused' if fused else 'explicit'}_vs_float32", relative_error(got, reference), BF16_TOLERANCE)

    losses = train_losses(seed=seed)
    report["train_losses"] = losses
    if not (all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0]):
        report["failures"].append(f"Adam on a repeated sequence did not halve the loss: {losses}")
    report["failures"] += trial_failures(seed)
    return report


class _Cycle:
    """Data for a trial: windows of one repeated 24-token cycle (next tokens learnable from context)."""

    vocab_size = 16

    def _windows(self, seq_len: int, count: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
        start = (np.arange(count)[:, None] * 5 + offset + np.arange(seq_len + 1)[None, :]) % 24
        tokens = (start * 7) % 16
        return tokens[:, :-1], tokens[:, 1:]

    def train_windows(self, seq_len: int, epoch: int, count: int | None = None, seed: int | None = None):
        return self._windows(seq_len, count or 8, epoch)

    def val_windows(self, seq_len: int, max_windows: int | None = None):
        return self._windows(seq_len, max_windows or 4, 11)


def trial_failures(seed: int) -> list[str]:
    """A language trial trained on this backend as the workers train it, and resumed at its second epoch.

    The resumed attempt continues the schedule where the first stopped (the optimizer's step
    counter is set on every backend) and learns; what a worker's re-queue relies on.
    """
    from aiperf.families.language.trainer import LMTraining

    hp = {"learning_rate": 0.01, "warmup_fraction": 0.0, "weight_decay": 0.0, "batch_size": 4, "seq_len": 16}
    hp["epochs"] = 2
    common = {"steps_per_epoch": 4, "eval_windows": 4, "seed": seed, "jit_compile": False}
    first = LMTraining(tiny_spec(), hp, _Cycle(), epochs=1, **common)
    initial, _ = first.evaluate()
    [one] = list(first.train())
    resumed = LMTraining(tiny_spec(), hp, _Cycle(), weights=first.weights(), start_epoch=1, **common)
    at_start = resumed.updates
    [two] = list(resumed.train())
    failures = []
    if (at_start, resumed.updates) != (4, 8):
        failures.append(f"a resumed trial's optimizer steps went {at_start} -> {resumed.updates}, not 4 -> 8")
    if not (np.isfinite(two.val_loss) and two.val_loss < one.val_loss < initial):
        failures.append(f"a trial did not learn: validation loss {initial} -> {one.val_loss} -> {two.val_loss}")
    return failures


# --- in-process (this process's backend) -----------------------------------------------------------------


def test_a_trial_trains_and_resumes_where_it_stopped():
    assert trial_failures(0) == []


def test_fused_attention_is_available_in_the_installed_keras():
    assert has_fused_attention() == hasattr(keras.ops, "dot_product_attention")
    layer = build_lm(tiny_spec()).get_layer("block0_attn")
    assert layer.get_config()["fused"] is True
    assert build_lm(tiny_spec(), fused_attention=False).get_layer("block0_attn").get_config()["fused"] is False


def test_seed_spec_matches_the_reference_tied_and_untied_both_attention_paths():
    tokens = np.random.default_rng(3).integers(0, 256, (2, 40))
    for tied in (True, False):
        spec = replace(seed_spec(), tied_output=tied)
        weights = random_weights(spec, 3)
        want = forward(spec, weights, tokens)
        fused = logits(build_lm(spec, weights, fused_attention=True), tokens)
        explicit = logits(build_lm(spec, weights, fused_attention=False), tokens)
        assert fused.shape == (2, 40, 256)
        assert relative_error(fused, want) <= TOLERANCE
        assert relative_error(explicit, want) <= TOLERANCE
        assert relative_error(fused, explicit) <= TOLERANCE


def test_full_sequence_length_and_a_single_token():
    spec = tiny_spec()
    weights = random_weights(spec, 4)
    model = build_lm(spec, weights)
    for seq in (1, spec.seq_len):
        tokens = np.random.default_rng(seq).integers(0, spec.vocab_size, (3, seq))
        assert relative_error(logits(model, tokens), forward(spec, weights, tokens)) <= TOLERANCE


def test_morph_chains_with_inherited_weights_keep_the_parents_logits():
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 256, (2, 32))
    for k, chain in enumerate(morph_chains(2, 5)):
        for tied in (True, False):
            parent = replace(seed_spec(), tied_output=tied)
            weights = random_weights(parent, 10 + k)
            keras_parent = logits(build_lm(parent, weights), tokens)
            spec = parent
            for morph in chain:
                spec, weights = apply_morph(spec, morph, weights, rng)
            assert spec != parent
            model = build_lm(spec)
            assert lm_weights_to_keras(model, weights) == len(spec.weight_shapes())
            assert relative_error(logits(model, tokens), keras_parent) <= TOLERANCE, (tied, chain)


def test_changing_a_later_token_leaves_earlier_logits_unchanged():
    spec = seed_spec()
    tokens = np.random.default_rng(6).integers(0, 256, (2, 24))
    changed = tokens.copy()
    changed[:, 10] = (changed[:, 10] + 7) % 256
    for fused in (True, False):
        model = build_lm(spec, random_weights(spec, 6), fused_attention=fused)
        before, after = logits(model, tokens), logits(model, changed)
        np.testing.assert_allclose(after[:, :10], before[:, :10], rtol=0, atol=1e-6)
        assert np.max(np.abs(after[:, 10:] - before[:, 10:])) > 1e-3


def test_weights_round_trip_exactly():
    for tied in (True, False):
        spec = replace(seed_spec(), tied_output=tied)
        weights = random_weights(spec, 7)
        model = build_lm(spec)
        assert lm_weights_to_keras(model, weights) == len(weights)
        back = lm_weights_from_keras(model)
        assert list(back) == list(spec.weight_shapes())  # same names, same order
        assert all(back[n].dtype == np.float32 and np.array_equal(back[n], weights[n]) for n in weights)
        assert ("out" in back) is not tied


def test_weight_mismatches_are_one_line_errors_naming_the_tensor():
    spec = tiny_spec(tied=False)
    model = build_lm(spec)
    weights = init_weights(spec, 0)
    before = lm_weights_from_keras(model)
    bad = {**weights, "blocks.0.wq": np.zeros((16, 8), np.float32)}
    with pytest.raises(AiperfError, match=r"blocks\.0\.wq needs shape \(16, 16\), got \(16, 8\)") as info:
        lm_weights_to_keras(model, bad)
    assert "\n" not in str(info.value)
    after = lm_weights_from_keras(model)
    assert all(np.array_equal(before[n], after[n]) for n in before)  # nothing assigned
    missing = {n: a for n, a in weights.items() if n != "out"}
    with pytest.raises(AiperfError, match="tensor out is missing"):
        lm_weights_to_keras(model, missing)
    with pytest.raises(AiperfError, match=r"unexpected tensor 'blocks\.1\.wq'"):
        lm_weights_to_keras(model, {**weights, "blocks.1.wq": weights["blocks.0.wq"]})
    with pytest.raises(AiperfError, match="not a language model"):
        lm_weights_to_keras(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]), weights)


def test_built_with_weights_equals_loaded_after():
    spec = tiny_spec()
    weights = random_weights(spec, 8)
    tokens = np.random.default_rng(8).integers(0, 16, (2, 16))
    model = build_lm(spec)
    lm_weights_to_keras(model, weights)
    assert relative_error(logits(build_lm(spec, weights), tokens), logits(model, tokens)) == 0.0


def test_save_and_load_keep_the_function(tmp_path):
    for tied in (True, False):
        spec = replace(tiny_spec(tied), norm_eps=3e-4)
        model = build_lm(spec, random_weights(spec, 9), fused_attention=tied)
        path = tmp_path / f"lm_{tied}.keras"
        model.save(path)
        loaded = keras.saving.load_model(path)
        tokens = np.random.default_rng(9).integers(0, 16, (2, 12))
        assert relative_error(logits(loaded, tokens), logits(model, tokens)) == 0.0
        assert loaded.get_layer("final_norm").get_config()["epsilon"] == 3e-4
        assert loaded.get_layer("block0_attn").get_config()["fused"] is tied


def test_adam_steps_lower_the_loss_on_a_repeated_sequence():
    losses = train_losses()
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses


def test_loss_helper_gives_nats_and_bits_per_byte():
    rng = np.random.default_rng(10)
    z = rng.normal(size=(2, 5, 7)).astype(np.float32)
    y = rng.integers(0, 7, (2, 5))
    log_softmax = z - np.log(np.exp(z).sum(-1, keepdims=True))
    nats = -np.mean(np.take_along_axis(log_softmax, y[..., None], axis=-1))
    got = lm_loss_and_metrics(z, y)
    assert got["loss_nats"] == pytest.approx(nats, rel=1e-5)
    assert got["bits_per_token"] == pytest.approx(nats / np.log(2), rel=1e-5)
    assert got["bits_per_byte"] == got["bits_per_token"]  # byte-level vocabulary: one byte per token
    assert lm_loss_and_metrics(z, y, bytes_per_token=4)["bits_per_byte"] == pytest.approx(got["bits_per_token"] / 4)
    assert float(keras.ops.convert_to_numpy(lm_cross_entropy(z, y))) == pytest.approx(nats, rel=1e-5)
    uniform = lm_loss_and_metrics(np.zeros((1, 3, 256), np.float32), np.zeros((1, 3), np.int64))
    assert uniform["bits_per_byte"] == pytest.approx(8.0, rel=1e-6)  # log2(256)
    with pytest.raises(AiperfError, match="bytes_per_token"):
        lm_loss_and_metrics(z, y, bytes_per_token=0)
    x, t = next_token_pairs(np.arange(10).reshape(2, 5))
    assert x.tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]] and t.tolist() == [[1, 2, 3, 4], [6, 7, 8, 9]]


def test_mixed_bfloat16_gives_float32_logits_close_to_float32():
    spec = seed_spec()
    weights = random_weights(spec, 11)
    tokens = np.random.default_rng(11).integers(0, 256, (2, 32))
    reference = logits(build_lm(spec, weights), tokens)
    for fused in (True, False):
        model = build_lm(spec, weights, dtype_policy="mixed_bfloat16", fused_attention=fused)
        out = model(tokens, training=False)
        assert keras.backend.standardize_dtype(out.dtype) == "float32"
        assert model.get_layer("block0_attn").compute_dtype == "bfloat16"
        assert model.get_layer("block0_attn").wq.dtype == "float32"
        assert relative_error(keras.ops.convert_to_numpy(out), reference) <= BF16_TOLERANCE
    back = lm_weights_from_keras(model)
    assert all(np.array_equal(back[n], weights[n]) for n in weights)  # variables stay float32


# --- the other backends, each in a subprocess ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_in_a_subprocess(backend):
    if backend == keras.backend.backend():
        pytest.skip(f"{backend} is this process's backend (checked in-process)")
    from helpers import backend_subprocess  # under pytest only: this file also runs as a script

    python, env = backend_subprocess(backend)
    proc = subprocess.run([python, str(Path(__file__).resolve())], env=env, capture_output=True, text=True, timeout=540)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == SKIP:
        pytest.skip(f"{backend}: {json.loads(lines[-1])['skipped']}")
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(lines[-1])
    assert report["backend"] == backend and report["failures"] == [], report


def main() -> int:
    with float32_matmuls():
        report = run_checks()
    print(json.dumps(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())

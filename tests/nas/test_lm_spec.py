"""The transformer LM description: validation, identity, JSON, parameter count and the NumPy reference forward."""

from __future__ import annotations

import dataclasses
import json
import math
import tracemalloc

import numpy as np
import pytest

from nas.errors import NasError
from nas.language.spec import (
    MAX_BLOCKS,
    MAX_PARAMS,
    MAX_WIDTH,
    TransformerSpec,
    check_weights,
    forward,
    gelu,
    init_weights,
    seed_spec,
)


def small(tied: bool = True, **changes) -> TransformerSpec:
    """Unequal blocks and width != heads * head_dim, so no shape coincidence hides a bug."""
    fields = dict(vocab_size=23, seq_len=9, width=10, head_dim=3, heads=(2, 3), mlp_hidden=(7, 5), tied_output=tied)
    return TransformerSpec(**{**fields, **changes})


def perturbed(spec: TransformerSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """float64 weights with every tensor, norm gains included, moved well away from its init."""
    rng = np.random.default_rng(seed)
    return {k: v + rng.normal(0, 0.5, v.shape) for k, v in init_weights(spec, rng, np.float64).items()}


def tokens_for(spec: TransformerSpec, seed: int = 0, batch: int = 2, seq: int | None = None) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, spec.vocab_size, (batch, seq or spec.seq_len))


def naive_forward(spec: TransformerSpec, w: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """The model written out position by position and head by head, to check the vectorised reference."""

    def norm(v, g):
        return g * v / math.sqrt(float(np.mean(v * v)) + spec.norm_eps)

    batch, seq = tokens.shape
    out = np.zeros((batch, seq, spec.vocab_size))
    hd = spec.head_dim
    for n in range(batch):
        xs = [w["tok_emb"][tokens[n, t]] + w["pos_emb"][t] for t in range(seq)]
        for b, heads in enumerate(spec.heads):
            p = f"blocks.{b}."
            a = [norm(x, w[p + "attn_norm"]) for x in xs]
            q, k, v = ([x @ w[p + m] for x in a] for m in ("wq", "wk", "wv"))
            new = []
            for t in range(seq):
                mixed = np.zeros(heads * hd)
                for h in range(heads):
                    s = slice(h * hd, (h + 1) * hd)
                    scores = np.array([q[t][s] @ k[u][s] / math.sqrt(hd) for u in range(t + 1)])
                    probs = np.exp(scores - scores.max())
                    probs /= probs.sum()
                    mixed[s] = sum(probs[u] * v[u][s] for u in range(t + 1))
                x = xs[t] + mixed @ w[p + "wo"]
                x = x + gelu(norm(x, w[p + "mlp_norm"]) @ w[p + "w_up"]) @ w[p + "w_down"]
                new.append(x)
            xs = new
        head = w["tok_emb"].T if spec.tied_output else w["out"]
        for t in range(seq):
            out[n, t] = norm(xs[t], w["final_norm"]) @ head
    return out


# --- the description ----------------------------------------------------------------------------------


def test_seed_spec_is_the_documented_byte_model():
    s = seed_spec()
    assert (s.vocab_size, s.seq_len, s.width, s.head_dim, s.heads, s.mlp_hidden) == (
        256,
        128,
        128,
        32,
        (4, 4),
        (512, 512),
    )
    assert s.n_blocks == 2 and s.tied_output and s.norm == "rmsnorm"
    # 256*128 + 128*128 embeddings, per block 2 gains + 4*128*128 attention + 2*128*512 MLP, a final gain
    assert s.params() == 256 * 128 + 128 * 128 + 2 * (2 * 128 + 4 * 128 * 128 + 2 * 128 * 512) + 128


@pytest.mark.parametrize(
    "spec",
    [seed_spec(), small(), small(tied=False), small(heads=(1, 4, 2), mlp_hidden=(1, 3, 8), seq_len=1)],
    ids=["seed", "tied", "untied", "three_blocks"],
)
def test_params_is_the_size_of_the_initial_weights(spec):
    weights = init_weights(spec, 0)
    assert spec.params() == sum(a.size for a in weights.values())
    assert list(weights) == list(spec.weight_shapes())
    check_weights(spec, weights)
    embeddings = spec.vocab_size * spec.width * (1 if spec.tied_output else 2) + spec.seq_len * spec.width
    assert spec.non_embedding_params() == spec.params() - embeddings


def test_weight_names_follow_the_documented_scheme():
    names = list(init_weights(small(tied=False), 0))
    block = ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_up", "w_down"]
    expected = ["tok_emb", "pos_emb", *[f"blocks.{b}.{n}" for b in range(2) for n in block], "final_norm", "out"]
    assert names == expected
    assert "out" not in init_weights(small(), 0)


def test_init_weights_is_deterministic_and_honours_dtype():
    a, b = init_weights(small(), 7), init_weights(small(), 7)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert all(v.dtype == np.float32 for v in a.values())
    assert all(v.dtype == np.float64 for v in init_weights(small(), 7, np.float64).values())
    assert all(np.all(a[k] == 1) for k in a if k.endswith("norm"))


def test_key_is_equal_for_equal_specs_and_differs_in_every_field():
    base = small()
    assert base.key() == small().key() == TransformerSpec.from_dict(base.to_dict()).key()
    assert base == small() and hash(base) == hash(small())
    changes = {
        "vocab_size": 24,
        "seq_len": 10,
        "width": 11,
        "head_dim": 4,
        "heads": (3, 2),
        "mlp_hidden": (5, 7),
        "tied_output": False,
        "norm_eps": 2e-5,
    }
    assert set(changes) | {"norm"} == {f.name for f in dataclasses.fields(TransformerSpec)}  # "norm" has one choice
    keys = {base.key()}
    for name, value in changes.items():
        keys.add(dataclasses.replace(base, **{name: value}).key())
    assert len(keys) == len(changes) + 1
    assert small(heads=(2, 3, 1), mlp_hidden=(7, 5, 1)).key() not in keys  # depth counts too
    assert len(base.key()) == 16 and int(base.key(), 16) >= 0


def test_lists_and_numpy_integers_are_normalised():
    spec = small(heads=[np.int64(2), 3], mlp_hidden=[7, np.int32(5)], width=np.int16(10))
    assert spec == small() and spec.heads == (2, 3) and type(spec.width) is int
    assert json.dumps(spec.to_dict())  # plain Python values only


def test_json_round_trip():
    for spec in (seed_spec(), small(tied=False, norm_eps=0.125)):
        doc = json.loads(json.dumps(spec.to_dict()))
        assert doc["format"] == "aiperf-transformer" and doc["version"] == 1
        back = TransformerSpec.from_dict(doc)
        assert back == spec and back.key() == spec.key()


def test_from_dict_defaults_the_optional_fields():
    doc = small().to_dict()
    for name in ("tied_output", "norm", "norm_eps"):
        del doc[name]
    assert TransformerSpec.from_dict(doc) == small()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: [0], "expected a JSON object"),
        (lambda d: {**d, "format": "aiperf-graph"}, "'format' must be"),
        (lambda d: {**d, "version": 2}, "unsupported version"),
        (lambda d: {**d, "version": True}, "unsupported version"),
        (lambda d: {**d, "dropout": 0.1}, "unknown key 'dropout'"),
        (lambda d: {**d, 3: 1}, "unknown key 3"),
        (lambda d: {k: v for k, v in d.items() if k != "width"}, "missing key 'width'"),
        (lambda d: {**d, "heads": "4,4"}, "heads must be a list"),
        (lambda d: {**d, "heads": {"0": 4}}, "heads must be a list"),
        (lambda d: {**d, "mlp_hidden": [512, "512"]}, r"mlp_hidden\[1\] must be an integer"),
        (lambda d: {**d, "tied_output": 1}, "tied_output must be true or false"),
    ],
)
def test_from_dict_rejects_malformed_documents(edit, message):
    with pytest.raises(NasError, match=message):
        TransformerSpec.from_dict(edit(seed_spec().to_dict()))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"vocab_size": -1}, "vocab_size must be between 2 and"),
        ({"vocab_size": 2**40}, "vocab_size must be between"),
        ({"vocab_size": 256.0}, "vocab_size must be an integer"),
        ({"vocab_size": "256"}, "vocab_size must be an integer"),
        ({"vocab_size": None}, "vocab_size must be an integer"),
        ({"seq_len": 0}, "seq_len must be between 1 and"),
        ({"seq_len": 10**30}, "seq_len must be between"),
        ({"width": True}, "width must be an integer"),
        ({"width": 2**17}, "width must be between"),
        ({"head_dim": 0}, "head_dim must be between"),
        ({"heads": (4, 0)}, r"heads\[1\] must be between 1 and"),
        ({"heads": (4, False)}, r"heads\[1\] must be an integer"),
        ({"heads": (4, 2**20)}, r"heads\[1\] must be between"),
        ({"heads": (), "mlp_hidden": ()}, "heads must list 1 to"),
        ({"heads": (4,) * (MAX_BLOCKS + 1)}, f"heads must list 1 to {MAX_BLOCKS} blocks"),
        ({"mlp_hidden": ("x",) * (MAX_BLOCKS + 1)}, "mlp_hidden must list 1 to"),  # length first, elements never read
        ({"mlp_hidden": (512, -3)}, r"mlp_hidden\[1\] must be between"),
        ({"mlp_hidden": (512,)}, "heads and mlp_hidden must list the same blocks, got 2 and 1"),
        ({"tied_output": "yes"}, "tied_output must be true or false"),
        ({"norm": "layernorm"}, "norm must be one of rmsnorm"),
        ({"norm_eps": 0}, "norm_eps must be a number in"),
        ({"norm_eps": float("nan")}, "norm_eps must be a number in"),
        ({"norm_eps": float("inf")}, "norm_eps must be a number in"),
        ({"norm_eps": 10**400}, "norm_eps must be a number in"),
        ({"norm_eps": True}, "norm_eps must be a number in"),
        ({"width": MAX_WIDTH, "head_dim": 1024, "heads": (1024, 1024)}, "parameter count .* exceeds MAX_PARAMS"),
        ({"heads": (1024,) * 64, "mlp_hidden": (1,) * 64, "width": 4096, "head_dim": 1024}, "parameter count"),
    ],
)
def test_hostile_fields_fail_with_one_error_naming_the_field(changes, message):
    with pytest.raises(NasError, match=message):
        dataclasses.replace(seed_spec(), **changes)


def test_hostile_sizes_fail_before_any_allocation():
    """A spec far over the caps is refused by arithmetic alone: no weight-sized memory is ever touched."""
    hostile = [
        {"vocab_size": 2**40},
        {"width": MAX_WIDTH, "head_dim": 1024, "heads": (1024, 1024)},  # each field within its cap, the product not
        {"heads": (1024,) * MAX_BLOCKS, "mlp_hidden": (2**18,) * MAX_BLOCKS, "width": MAX_WIDTH},
    ]
    base = seed_spec().to_dict()
    tracemalloc.start()
    try:
        for changes in hostile:
            doc = {**base, **{k: list(v) if isinstance(v, tuple) else v for k, v in changes.items()}}
            with pytest.raises(NasError):
                TransformerSpec.from_dict(doc)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_params_cap_is_inclusive_and_exact():
    # params / width = vocab + seq_len + 3 + 4 * heads * head_dim + 2 * mlp_hidden = 2**22 = MAX_PARAMS / 2**16
    at_cap = TransformerSpec(
        vocab_size=256, seq_len=1, width=MAX_WIDTH, head_dim=1024, heads=(1023,), mlp_hidden=(1918,)
    )
    assert at_cap.params() == MAX_PARAMS
    with pytest.raises(NasError, match="parameter count"):
        dataclasses.replace(at_cap, mlp_hidden=(1919,))


# --- the reference forward pass ---------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_forward_matches_the_model_written_out_position_by_position(tied):
    spec = small(tied, norm_eps=0.05)
    w = perturbed(spec, 3)
    tokens = tokens_for(spec, 4, batch=2, seq=7)
    logits = forward(spec, w, tokens)
    assert logits.shape == (2, 7, spec.vocab_size) and logits.dtype == np.float64
    np.testing.assert_allclose(logits, naive_forward(spec, w, tokens), rtol=1e-10, atol=1e-10)


def test_forward_is_causal_and_position_aware():
    spec = small()
    w = perturbed(spec, 1)
    tokens = tokens_for(spec, 2)
    logits = forward(spec, w, tokens)
    changed = tokens.copy()
    changed[:, 5] = (changed[:, 5] + 1) % spec.vocab_size
    other = forward(spec, w, changed)
    np.testing.assert_array_equal(other[:, :5], logits[:, :5])  # earlier positions never see later tokens
    assert not np.allclose(other[:, 5:], logits[:, 5:])
    np.testing.assert_allclose(forward(spec, w, tokens[:, :4]), logits[:, :4], rtol=1e-12)  # a prefix is a prefix
    same = np.full((1, 4), 3)
    out = forward(spec, w, same)
    assert not np.allclose(out[0, 0], out[0, 3])  # learned positions tell equal tokens apart


def test_tied_output_reads_the_embedding():
    spec = small()
    w = perturbed(spec, 5)
    untied = dataclasses.replace(spec, tied_output=False)
    wu = {**w, "out": w["tok_emb"].T.copy()}
    tokens = tokens_for(spec, 6)
    np.testing.assert_allclose(forward(untied, wu, tokens), forward(spec, w, tokens), rtol=1e-12)


def test_gelu_is_the_tanh_approximation():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(gelu(x), want, rtol=1e-15)
    assert gelu(np.array([0.0]))[0] == 0.0


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (np.zeros((2, 3), np.float64), "integer array"),
        (np.zeros((2, 3), bool), "integer array"),
        (np.zeros(3, np.int64), "shape"),
        (np.zeros((2, 10), np.int64), "shape"),  # longer than seq_len 9
        (np.zeros((0, 3), np.int64), "shape"),
        (np.full((1, 3), 23), r"\[0, 23\)"),
        (np.full((1, 3), -1), r"\[0, 23\)"),
    ],
)
def test_forward_rejects_bad_tokens(tokens, message):
    spec = small()
    with pytest.raises(NasError, match=message):
        forward(spec, init_weights(spec, 0), tokens)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda w: {k: v for k, v in w.items() if k != "blocks.1.wo"}, "blocks.1.wo is missing"),
        (lambda w: {**w, "out": np.zeros((10, 23))}, "unexpected 'out'"),
        (lambda w: {**w, "blocks.0.wq": np.zeros((10, 9))}, r"blocks.0.wq needs shape \(10, 6\)"),
        (lambda w: list(w.values()), "mapping of name to array"),
    ],
)
def test_weights_must_fit_the_spec(edit, message):
    spec = small()
    with pytest.raises(NasError, match=message):
        forward(spec, edit(init_weights(spec, 0)), tokens_for(spec))

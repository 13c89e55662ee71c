"""A language model's kept weights: written by the weight store, read back checked against the spec.

The same file format and the same header-first reader as image sets (test_bounded_weights.py),
with members named by the weights' own names; a file that is not the spec's weights fails with
one line naming the file and the member.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from aiperf.engine.weights import (
    WeightsFileError,
    WeightStore,
    file_sha256,
    load_lm_weights,
    load_weights,
    weights_bytes,
)
from nas.language.spec import TransformerSpec, init_weights

SPEC = TransformerSpec(vocab_size=256, seq_len=16, width=16, head_dim=8, heads=(2,), mlp_hidden=(32,))


def _npy(shape: tuple[int, ...], descr: str = "<f4", data: bytes | None = None) -> bytes:
    """A ``.npy`` stream as numpy writes it (zeros of ``shape`` unless ``data`` is given)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    return header.getvalue() + (bytes(int(np.prod(shape)) * np.dtype(descr).itemsize) if data is None else data)


def _file(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(f"{name}.npy", data)
    return path


def test_an_lm_set_round_trips_with_and_without_its_spec(tmp_path):
    weights = init_weights(SPEC, 3)
    path = tmp_path / "t00001.npz"
    path.write_bytes(weights_bytes(weights))
    for spec in (SPEC, None):
        back = load_lm_weights(path, spec)
        assert back.keys() == weights.keys()
        assert all(back[n].dtype == np.float32 and np.array_equal(back[n], weights[n]) for n in weights)
    with pytest.raises(WeightsFileError, match=r"member 'tok_emb' is not an array named node:index.npy"):
        load_weights(path)  # an LM file is never read as an image set, nor the other way round
    image = tmp_path / "t00002.npz"
    image.write_bytes(weights_bytes({1: [np.zeros((2, 3), np.float32)]}))
    with pytest.raises(WeightsFileError, match=r"member '1:0' is not an array named <weight name>.npy"):
        load_lm_weights(image)


def test_the_store_writes_reloads_and_falls_back_to_lm_files(tmp_path):
    weights = init_weights(SPEC, 4)
    store = WeightStore(2, tmp_path / "weights", loader=load_lm_weights)
    assert store.put("t00001", weights, 0.5)
    saved = store.saved("t00001")
    assert saved is not None and (saved.sha256, saved.size) == file_sha256(tmp_path / "weights" / "t00001.npz")
    assert load_lm_weights(tmp_path / "weights" / "t00001.npz", SPEC).keys() == weights.keys()
    again = WeightStore(2, tmp_path / "weights", loader=load_lm_weights)
    assert again.reload({"t00001": 0.5}) == []  # --resume reads the LM file back
    back = again.get("t00001")
    assert back is not None and all(np.array_equal(back[n], weights[n]) for n in weights)
    plain = WeightStore(2, tmp_path / "weights")  # the image loader skips it, naming the file
    assert plain.reload({"t00001": 0.5}) == ["weights/t00001.npz"] and plain.get("t00001") is None


def _members() -> dict[str, bytes]:
    return {name: _npy(shape) for name, shape in SPEC.weight_shapes().items()}


def _forged(kind: str) -> dict[str, bytes]:
    members = _members()
    if kind == "shape":
        members["blocks.0.wq"] = _npy((16, 8))
    elif kind == "missing":
        del members["blocks.0.wq"]
    elif kind == "extra":
        del members["final_norm"]
        members["blocks.1.wq"] = _npy((16, 16))
    elif kind == "more":
        members["blocks.1.wq"] = _npy((16, 16))
    elif kind == "pickle":
        members["blocks.0.wq"] = _npy((16, 16), descr="|O", data=b"")
    elif kind == "colon":
        members["blocks.0:wq"] = members.pop("blocks.0.wq")
    elif kind == "float64":
        members["tok_emb"] = _npy((256, 16), descr="<f8")
    return members


FORGERIES = [
    ("shape", "member 'blocks.0.wq' declares 128 elements, the architecture needs 256"),
    ("missing", "has no member 'blocks.0.wq', an array of the architecture"),
    ("extra", "member 'blocks.1.wq' is not an array of the architecture"),
    ("more", "holds 12 members, the architecture has 11 arrays"),
    ("pickle", "member 'blocks.0.wq' declares dtype 'object', not float32"),
    ("colon", "member 'blocks.0:wq' is not an array named <weight name>.npy"),
    ("float64", "member 'tok_emb' declares dtype 'float64', not float32"),
]


@pytest.mark.parametrize(("kind", "message"), FORGERIES, ids=[k for k, _ in FORGERIES])
def test_a_file_that_is_not_the_specs_weights_fails_in_one_line_naming_it(tmp_path, kind, message):
    path = _file(tmp_path / "t00007.npz", _forged(kind))
    with pytest.raises(WeightsFileError) as err:
        load_lm_weights(path, SPEC, name="weights/t00007.npz")
    text = str(err.value)
    assert text.startswith("weights/t00007.npz: ") and message in text and "\n" not in text, text
    if kind in ("shape", "missing", "extra", "more"):
        return  # only the spec tells these from a good file
    with pytest.raises(WeightsFileError, match=r"weights/t00007\.npz: "):
        load_lm_weights(path, None, name="weights/t00007.npz")


def test_a_weight_name_with_a_colon_is_refused_when_written():
    weights = init_weights(SPEC, 0)
    weights["blocks.0:wq"] = weights.pop("blocks.0.wq")
    with pytest.raises(WeightsFileError, match=r"array name 'blocks.0:wq' is not letters, digits"):
        weights_bytes(weights)

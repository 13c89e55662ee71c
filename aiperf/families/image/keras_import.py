"""Keras 3 functional (or Sequential) model -> architecture graph, with its weights.

This lets a user start the search from any CNN written in Keras, e.g. the classic
``keras.applications`` families (ResNet v1/v2, VGG, MobileNet v1/v2, DenseNet, Inception
v3, Xception). Each Keras layer maps onto one or a few graph nodes:

* fused activations of Conv2D/Dense/SeparableConv2D become a separate ``act`` node;
* ``SeparableConv2D`` becomes a depthwise conv followed by a 1x1 conv;
* ``ReLU`` with ``max_value=6`` becomes ``relu6``; ``Activation("linear")`` and
  ``Identity`` disappear; a trailing softmax is dropped, since graphs output logits;
* nested functional or Sequential models are inlined.

Anything else raises :class:`AiperfError` naming the layer, e.g. ``cannot import layer
'block_se_excite' (Multiply): not representable as an aiperf graph op``. Only public layer
attributes are read, plus the functional graph's node records (``_keras_history`` and
``_inbound_nodes``), which is how Keras itself walks a model; nothing here is
backend-specific.
"""

from __future__ import annotations

import json
import math
import re
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Protocol

import numpy as np

from aiperf.archives import open_zip, read_member
from aiperf.errors import AiperfError, excerpt, first_line
from nas.errors import NasError
from nas.graph import Graph, Node, make_node

if TYPE_CHECKING:
    from keras import KerasTensor, Layer, Model

Weights = dict[int, list[np.ndarray]]
KERAS_FILE_SUFFIXES = (".keras", ".h5", ".hdf5")

# A .keras archive's JSON members (config.json, metadata.json) and anything but its weights:
# 8x the largest keras.applications config (NASNetLarge's config.json, 1.0 MB).
MAX_KERAS_JSON_BYTES = 8 << 20
# Its weights (model.weights.h5 / .npz) or a whole .h5 model file: the largest keras.applications
# model, ConvNeXtXLarge (350 M float32 parameters, 1.4 GB), fits.
MAX_KERAS_WEIGHTS_BYTES = 2 << 30
# Entries of a .keras archive: Keras writes three (metadata, config, weights) and assets only for
# layers (text lookups and the like) this importer does not take anyway.
MAX_KERAS_MEMBERS = 64
# Groups and datasets walked in an HDF5 weights file: 20x NASNetLarge's (about 5,000).
MAX_H5_OBJECTS = 100_000
_KERAS_WEIGHTS_MEMBERS = ("model.weights.h5", "model.weights.npz")

# Keras activation function name -> graph activation.
_ACTIVATIONS = {
    "relu": "relu",
    "relu6": "relu6",
    "sigmoid": "sigmoid",
    "hard_sigmoid": "hard_sigmoid",
    "tanh": "tanh",
    "silu": "swish",
    "swish": "swish",
    "gelu": "gelu",
    "softmax": "softmax",
    "linear": "linear",
}


class _KerasNode(Protocol):
    """A node of Keras's functional graph: one call of a layer (or a nested model) on its input tensors."""

    operation: Layer
    input_tensors: list[KerasTensor]
    outputs: list[KerasTensor]


def _cannot(layer: Layer, why: str) -> AiperfError:
    return AiperfError(f"cannot import layer {layer.name!r} ({type(layer).__name__}): {why}")


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    """A Keras kernel size, stride or pool size (an int or two of them) as two ints."""
    if isinstance(value, int):
        return (value, value)
    first, second = (int(v) for v in value)
    return (first, second)


class _Importer:
    """Walks a functional model's layer graph and emits graph nodes and their weights."""

    def __init__(self, keras: ModuleType) -> None:
        self.keras = keras
        self.nodes: list[Node] = []
        self.weights: Weights = {}
        self.layer_of: dict[int, str] = {}  # node id -> "'name' (Class)" for error messages
        L = keras.layers
        self.handlers: dict[type, Callable[[Layer, list[int], list[tuple], list[np.ndarray]], int]] = {
            L.Conv2D: self._conv,
            L.DepthwiseConv2D: self._dwconv,
            L.SeparableConv2D: self._separable,
            L.BatchNormalization: self._bn,
            L.ReLU: self._relu,
            L.Activation: self._activation,
            L.Softmax: self._softmax,
            L.Dense: self._dense,
            L.MaxPooling2D: self._pool,
            L.AveragePooling2D: self._pool,
            L.GlobalAveragePooling2D: self._gpool,
            L.GlobalMaxPooling2D: self._gpool,
            L.Dropout: self._dropout,
            L.Flatten: self._flatten,
            L.Reshape: self._reshape,
            L.ZeroPadding2D: self._zeropad,
            L.Add: self._add,
            L.Concatenate: self._concat,
            L.Identity: self._identity,
        }

    # --- emitting nodes ----------------------------------------------------------------------
    def emit(
        self,
        layer: Layer | None,
        op: str,
        inputs: Sequence[int],
        attrs: dict[str, object] | None = None,
        weights: list[np.ndarray] | None = None,
    ) -> int:
        node_id = len(self.nodes)
        try:
            self.nodes.append(make_node(node_id, op, inputs, attrs or {}))
        except NasError as exc:
            if layer is None:
                raise AiperfError(f"cannot import the model's input: {exc}") from None
            raise _cannot(layer, str(exc)) from None
        if weights is not None:
            self.weights[node_id] = [np.asarray(w, dtype=np.float32) for w in weights]
        if layer is not None:
            self.layer_of[node_id] = f"{layer.name!r} ({type(layer).__name__})"
        return node_id

    def fused_activation(self, layer: Layer, x: int) -> int:
        name = getattr(layer.activation, "__name__", None)
        if name not in _ACTIVATIONS:
            raise _cannot(layer, f"activation {name or layer.activation!r} is not supported")
        return x if name == "linear" else self.emit(layer, "act", [x], {"fn": _ACTIVATIONS[name]})

    # --- walking the functional graph ------------------------------------------------------------
    def run_model(self, model: Model, input_ids: list[int]) -> int:
        """Inline ``model`` reading graph nodes ``input_ids``; returns the node of its output."""
        inputs, outputs = _model_io(model)
        if len(inputs) != len(input_ids):
            raise AiperfError(
                f"cannot import model {model.name!r}: it takes {len(inputs)} inputs, got {len(input_ids)}"
            )
        if len(outputs) != 1:
            raise AiperfError(f"cannot import model {model.name!r}: it has {len(outputs)} outputs (one is needed)")
        values = {id(t): v for t, v in zip(inputs, input_ids, strict=True)}
        for knode in _topological_nodes(outputs, values):
            layer = knode.operation
            args = [values[id(t)] for t in knode.input_tensors]
            if len(knode.outputs) != 1:
                raise _cannot(layer, f"it has {len(knode.outputs)} outputs (one is needed)")
            if isinstance(layer, self.keras.Model):
                out = self.run_model(layer, args)
            else:
                out = self.convert(layer, knode, args)
            values[id(knode.outputs[0])] = out
        return values[id(outputs[0])]

    def convert(self, layer: Layer, knode: _KerasNode, args: list[int]) -> int:
        handler = self.handlers.get(type(layer))
        if handler is None:
            if isinstance(layer, self.keras.layers.InputLayer):
                raise _cannot(layer, "the model has more than one input")
            raise _cannot(layer, "not representable as an aiperf graph op")
        if getattr(layer, "quantization_mode", None):
            raise _cannot(layer, "quantized layers are not supported")
        if getattr(layer, "lora_enabled", False):
            raise _cannot(layer, "LoRA layers are not supported (merge the adapter into the kernel first)")
        if getattr(layer, "data_format", "channels_last") != "channels_last":
            raise _cannot(layer, "only channels_last data is supported")
        in_shapes = [tuple(t.shape[1:]) for t in knode.input_tensors]
        return handler(layer, args, in_shapes, layer.get_weights())

    # --- one handler per layer type --------------------------------------------------------------
    def _check_undilated(self, layer: Layer) -> None:
        if _pair(layer.dilation_rate) != (1, 1):
            raise _cannot(layer, f"dilation_rate {_pair(layer.dilation_rate)} is not supported (only 1)")
        if layer.padding not in ("same", "valid"):
            raise _cannot(layer, f"padding {layer.padding!r} is not supported")

    def _conv(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        self._check_undilated(layer)
        attrs = {
            "filters": layer.filters,
            "kernel": _pair(layer.kernel_size),
            "strides": _pair(layer.strides),
            "padding": layer.padding,
            "groups": layer.groups,
            "use_bias": layer.use_bias,
        }
        return self.fused_activation(layer, self.emit(layer, "conv", args, attrs, w))

    def _dwconv(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        self._check_undilated(layer)
        attrs = {
            "kernel": _pair(layer.kernel_size),
            "strides": _pair(layer.strides),
            "padding": layer.padding,
            "multiplier": layer.depth_multiplier,
            "use_bias": layer.use_bias,
        }
        return self.fused_activation(layer, self.emit(layer, "dwconv", args, attrs, w))

    def _separable(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        self._check_undilated(layer)
        depthwise, pointwise, *bias = w
        dw = {
            "kernel": _pair(layer.kernel_size),
            "strides": _pair(layer.strides),
            "padding": layer.padding,
            "multiplier": layer.depth_multiplier,
            "use_bias": False,
        }
        x = self.emit(layer, "dwconv", args, dw, [depthwise])
        pw = {"filters": layer.filters, "kernel": (1, 1), "use_bias": layer.use_bias}
        return self.fused_activation(layer, self.emit(layer, "conv", [x], pw, [pointwise, *bias]))

    def _bn(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        rank = len(shapes[0])
        if layer.axis not in (-1, rank):
            raise _cannot(layer, f"normalises axis {layer.axis}, only the channel (last) axis is supported")
        arrays = list(w)
        channels = shapes[0][-1]
        gamma = arrays.pop(0) if layer.scale else np.ones(channels, np.float32)
        beta = arrays.pop(0) if layer.center else np.zeros(channels, np.float32)
        mean, var = arrays
        return self.emit(layer, "bn", args, {"epsilon": float(layer.epsilon)}, [gamma, beta, mean, var])

    def _relu(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        max_value = None if layer.max_value is None else float(layer.max_value)
        if float(layer.negative_slope) != 0.0 or float(layer.threshold) != 0.0 or max_value not in (None, 6.0):
            raise _cannot(layer, "only ReLU without slope or threshold, capped at nothing or 6, is supported")
        return self.emit(layer, "act", args, {"fn": "relu" if max_value is None else "relu6"})

    def _activation(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        return self.fused_activation(layer, args[0])

    def _softmax(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
        if list(axes) not in ([-1], [len(shapes[0])]):
            raise _cannot(layer, f"softmax over axis {layer.axis} (only the last axis is supported)")
        return self.emit(layer, "act", args, {"fn": "softmax"})

    def _dense(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        if len(shapes[0]) != 1:
            raise _cannot(layer, f"input of shape {shapes[0]}: only dense layers on vectors are supported")
        attrs = {"units": layer.units, "use_bias": layer.use_bias}
        return self.fused_activation(layer, self.emit(layer, "dense", args, attrs, w))

    def _pool(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        mode = "max" if isinstance(layer, self.keras.layers.MaxPooling2D) else "avg"
        if layer.padding not in ("same", "valid"):
            raise _cannot(layer, f"padding {layer.padding!r} is not supported")
        attrs = {
            "mode": mode,
            "size": _pair(layer.pool_size),
            "strides": _pair(layer.strides),
            "padding": layer.padding,
        }
        return self.emit(layer, "pool", args, attrs)

    def _gpool(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        mode = "max" if isinstance(layer, self.keras.layers.GlobalMaxPooling2D) else "avg"
        return self.emit(layer, "gpool", args, {"mode": mode, "keepdims": bool(layer.keepdims)})

    def _dropout(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        if getattr(layer, "noise_shape", None) is not None:
            raise _cannot(layer, "dropout with a noise_shape is not supported")
        return self.emit(layer, "dropout", args, {"rate": float(layer.rate)})

    def _flatten(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        return self.emit(layer, "flatten", args)

    def _reshape(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        if any(d is None or d < 0 for d in layer.target_shape):
            raise _cannot(layer, f"target shape {layer.target_shape} must be fully specified")
        return self.emit(layer, "reshape", args, {"shape": tuple(int(d) for d in layer.target_shape)})

    def _zeropad(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        (top, bottom), (left, right) = layer.padding
        return self.emit(layer, "zeropad", args, {"pad": (top, bottom, left, right)})

    def _add(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        return self.emit(layer, "add", args)

    def _concat(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        if layer.axis not in (-1, len(shapes[0])):
            raise _cannot(layer, f"concatenates axis {layer.axis}, only the channel (last) axis is supported")
        return self.emit(layer, "concat", args)

    def _identity(self, layer: Layer, args: list[int], shapes: list[tuple], w: list[np.ndarray]) -> int:
        return args[0]

    # --- the result -------------------------------------------------------------------------------
    def finish(self, output: int, name: str) -> tuple[Graph, Weights]:
        """Keep the nodes the output depends on, drop a trailing softmax and validate the graph."""
        while self.nodes[output].op == "act" and self.nodes[output].attrs["fn"] == "softmax":
            output = self.nodes[output].inputs[0]
        needed, stack = set(), [output]
        while stack:
            node_id = stack.pop()
            if node_id not in needed:
                needed.add(node_id)
                stack.extend(self.nodes[node_id].inputs)
        nodes = [n for n in self.nodes if n.id in needed]
        try:
            graph = Graph(nodes, name=name)
        except NasError as exc:
            raise AiperfError(f"cannot import model {name!r}: {self._name_layers(str(exc))}") from None
        return graph, {k: v for k, v in self.weights.items() if k in needed}

    def _name_layers(self, message: str) -> str:
        """Point node labels (``n12_dense``) in a graph error at the Keras layer they came from."""

        def name(match: re.Match) -> str:
            layer = self.layer_of.get(int(match.group(1)))
            return f"layer {layer}" if layer else match.group(0)

        return re.sub(r"\bn(\d+)_[a-z]+\b", name, message)


def _model_io(model: Model) -> tuple[list[KerasTensor], list[KerasTensor]]:
    try:
        inputs, outputs = list(model.inputs), list(model.outputs)
    except (AttributeError, ValueError, TypeError):
        inputs = outputs = []
    if not inputs or not outputs:
        raise AiperfError(
            f"cannot import model {getattr(model, 'name', model)!r}: only built functional or Sequential models "
            "(with a known input shape) can be imported"
        )
    return inputs, outputs


def _topological_nodes(outputs: list[KerasTensor], known: dict[int, int]) -> list[_KerasNode]:
    """The Keras graph nodes computing ``outputs`` from the ``known`` tensors, inputs first."""

    def producer(tensor: KerasTensor) -> _KerasNode:
        operation, node_index, _ = tensor._keras_history
        return operation._inbound_nodes[node_index]

    order: list[_KerasNode] = []
    state: dict[int, bool] = {}  # False: visiting, True: done
    stack = [(producer(t), False) for t in reversed(outputs) if id(t) not in known]
    while stack:
        knode, expanded = stack.pop()
        if expanded:
            state[id(knode)] = True
            order.append(knode)
            continue
        if id(knode) in state:
            continue
        state[id(knode)] = False
        stack.append((knode, True))
        stack.extend((producer(t), False) for t in reversed(knode.input_tensors) if id(t) not in known)
    return order


def _graph_name(model: Model) -> str:
    name = "".join(c if c.isprintable() and c != "/" else "_" for c in str(model.name))
    return name[:200]


def import_keras(model: Model) -> tuple[Graph, Weights]:
    """The architecture graph of a Keras model and its weights by node id (see the module docstring)."""
    import keras

    if not isinstance(model, keras.Model):
        raise AiperfError(f"expected a Keras model, got {type(model).__name__}")
    inputs, _ = _model_io(model)
    if len(inputs) != 1:
        raise AiperfError(f"cannot import model {model.name!r}: it has {len(inputs)} inputs (one is needed)")
    shape = tuple(inputs[0].shape[1:])
    if any(d is None for d in shape):
        raise AiperfError(f"cannot import model {model.name!r}: input shape {shape} must be fully defined")
    importer = _Importer(keras)
    first = importer.emit(None, "input", [], {"shape": shape})
    output = importer.run_model(model, [first])
    return importer.finish(output, _graph_name(model))


def graph_from_keras(model: Model) -> Graph:
    """The architecture graph of a Keras 3 functional or Sequential model."""
    return import_keras(model)[0]


def weights_from_keras(model: Model, graph: Graph) -> Weights:
    """The model's weights keyed by the node ids of ``graph`` (which must be this model's import).

    With them, ``aiperf.families.image.model.build_model(graph)`` computes the same function as ``model``.
    """
    imported, weights = import_keras(model)
    if imported != graph:
        raise AiperfError(f"the graph {graph.name!r} is not the import of model {model.name!r}")
    return weights


def _check_h5(source: Path | IO[bytes], label: str, stored: int) -> None:
    """Raise unless the HDF5 weights in ``source`` (a path or a seekable stream) declare at most ``stored``
    bytes of arrays: Keras writes its datasets uncompressed, so arrays larger than the file holding them
    are a shape bomb (read as declared, a few KB that say 3 GB allocate 3 GB). Reads metadata only."""
    import h5py

    found = {"objects": 0, "bytes": 0}

    def visit(name: str, obj: object) -> None:
        found["objects"] += 1
        if found["objects"] > MAX_H5_OBJECTS:
            raise AiperfError(f"{label}: its HDF5 weights hold more than {MAX_H5_OBJECTS:,} groups and datasets")
        if isinstance(obj, h5py.Dataset):
            found["bytes"] += math.prod(obj.shape or ()) * obj.dtype.itemsize
            if found["bytes"] > stored:
                raise AiperfError(
                    f"{label}: its HDF5 dataset {excerpt(name)} brings the arrays it declares to "
                    f"{found['bytes']:,} bytes, more than the {stored:,} bytes that hold them"
                )

    try:
        with h5py.File(source, "r") as h5:
            h5.visititems(visit)
    except AiperfError:
        raise
    except Exception as exc:  # h5py raises OSError, ValueError, KeyError, RuntimeError for a damaged file
        raise AiperfError(f"{label}: cannot load the Keras model (HDF5: {first_line(exc, 200)})") from None


def _check_keras_archive(path: Path) -> None:
    """Check a ``.keras`` archive from its headers before Keras reads it (:mod:`aiperf.archives`).

    Its entries are counted, every member's declared size is checked against its cap (the JSON
    members and anything else :data:`MAX_KERAS_JSON_BYTES`, the weights
    :data:`MAX_KERAS_WEIGHTS_BYTES`), the JSON members are read with a read that stops past the cap
    and must parse, and HDF5 weights must not declare more array bytes than they hold. Keras then
    reads what was checked (``zipfile`` unpacks a member only up to its checked declared size).
    """
    label = str(path)
    if not zipfile.is_zipfile(path):  # reads the end record only
        raise AiperfError(f"{label}: cannot load the Keras model (a .keras file is a zip archive, this is not)")
    with open_zip(path, label, MAX_KERAS_MEMBERS) as archive:
        infos = archive.infolist()
        for info in infos:
            cap = MAX_KERAS_WEIGHTS_BYTES if info.filename in _KERAS_WEIGHTS_MEMBERS else MAX_KERAS_JSON_BYTES
            if info.file_size > cap:
                raise AiperfError(
                    f"{label}: member {excerpt(info.filename)} declares {info.file_size:,} bytes unpacked, "
                    f"at most {cap:,} are read"
                )
        for info in infos:
            if info.filename.endswith(".json") and "/" not in info.filename:
                data = read_member(archive, info, MAX_KERAS_JSON_BYTES, label)
                try:
                    json.loads(data)
                except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than Python recurses
                    raise AiperfError(
                        f"{label}: member {excerpt(info.filename)} is not JSON ({first_line(exc, 120)})"
                    ) from None
            elif info.filename == "model.weights.h5":
                with archive.open(info) as fh:
                    _check_h5(fh, label, info.file_size)


def load_keras_file(path: str | Path) -> Model:
    """Load a ``.keras`` or ``.h5`` model file (safe mode: no arbitrary code) without compiling it.

    The file is checked from its headers first (:func:`_check_keras_archive`, or for ``.h5`` its
    size and its datasets' declared sizes), so a small file that unpacks or allocates gigabytes
    fails naming itself; should memory run out anyway, so does that.
    """
    path = Path(path)
    if path.suffix.lower() not in KERAS_FILE_SUFFIXES:
        raise AiperfError(f"{path}: not a Keras model file (expected {', '.join(KERAS_FILE_SUFFIXES)})")
    if not path.is_file():
        raise AiperfError(f"{path}: no such file")
    try:
        if path.suffix.lower() == ".keras":
            _check_keras_archive(path)
        else:
            size = path.stat().st_size
            if size > MAX_KERAS_WEIGHTS_BYTES + MAX_KERAS_JSON_BYTES:
                limit = MAX_KERAS_WEIGHTS_BYTES + MAX_KERAS_JSON_BYTES
                raise AiperfError(f"{path}: {size:,} bytes, more than a Keras model file of at most {limit:,}")
            _check_h5(path, str(path), size)
        import keras  # after the checks: a refused file costs no framework start-up

        return keras.saving.load_model(path, compile=False, safe_mode=True)
    except AiperfError:
        raise
    except MemoryError:
        raise AiperfError(f"{path}: ran out of memory loading the Keras model") from None
    except OSError as exc:
        raise AiperfError(f"{path}: cannot read the Keras model ({exc.strerror or first_line(exc, 200)})") from None
    except Exception as exc:  # Keras raises many types (ValueError, OSError, zip and HDF5 errors) for bad files
        raise AiperfError(f"{path}: cannot load the Keras model ({first_line(exc, 200)})") from None


def graph_from_keras_file(path: str | Path) -> Graph:
    """The architecture graph of a saved Keras model file (``.keras`` or ``.h5``)."""
    return import_keras_file(path)[0]


def import_keras_file(path: str | Path) -> tuple[Graph, Weights]:
    """Graph and weights of a saved Keras model file, e.g. to seed a search with trained weights."""
    model = load_keras_file(path)
    try:
        return import_keras(model)
    except MemoryError:  # the import copies the weights as float32
        raise AiperfError(f"{path}: ran out of memory importing the Keras model") from None

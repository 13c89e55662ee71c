"""Architecture JSON: exact round trips, and a corpus of malformed or hostile files rejected in one line."""

from __future__ import annotations

import json
import os
import tracemalloc

import numpy as np
import pytest

from nas import serialize, zoo
from nas.errors import NasError
from nas.graph import MAX_NODES
from nas.morph import random_morph


def doc(*nodes, **top):
    """An architecture document; ``nodes`` default to a valid two-layer net."""
    body = {"format": "aiperf-graph", "version": 1, "name": "t"}
    body["nodes"] = list(nodes) or [
        {"id": 0, "op": "input", "inputs": [], "attrs": {"shape": [4, 4, 2]}},
        {"id": 1, "op": "gpool", "inputs": [0], "attrs": {}},
        {"id": 2, "op": "dense", "inputs": [1], "attrs": {"units": 3}},
    ]
    body.update(top)
    return json.dumps(body)


def net(*middle, head=True):
    """A document whose nodes are an input (4x4x2), ``middle`` (ids from 1) and a gpool+dense head."""
    nodes = [{"id": 0, "op": "input", "inputs": [], "attrs": {"shape": [4, 4, 2]}}]
    for k, (op, inputs, attrs) in enumerate(middle, start=1):
        nodes.append({"id": k, "op": op, "inputs": inputs, "attrs": attrs})
    if head:
        last = len(nodes) - 1
        nodes.append({"id": last + 1, "op": "gpool", "inputs": [last], "attrs": {}})
        nodes.append({"id": last + 2, "op": "dense", "inputs": [last + 1], "attrs": {"units": 3}})
    return doc(*nodes)


def nested(depth: int) -> str:
    return doc(**{"name": "t"})[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}"


def hostile_corpus() -> list[tuple[str, str | bytes, str]]:
    """(label, file content, expected fragment of the error): every one must be rejected."""
    valid = json.loads(doc())
    cases: list[tuple[str, str | bytes, str]] = [
        # not JSON at all
        ("empty", "", "invalid JSON"),
        ("truncated", doc()[:40], "invalid JSON"),
        ("garbage bytes", b"\xff\xfe\x00garbage", "invalid JSON"),
        ("binary zeros", b"\x00" * 64, "invalid JSON"),
        ("python literal", "{'format': 'aiperf-graph'}", "invalid JSON"),
        ("trailing junk", doc() + " x", "invalid JSON"),
        ("NaN literal", net(("dropout", [0], {"rate": "NaN"})).replace('"NaN"', "NaN"), "NaN is not a valid number"),
        (
            "Infinity literal",
            net(("bn", [0], {"epsilon": 1})).replace('"epsilon": 1', '"epsilon": Infinity'),
            "Infinity is not a valid number",
        ),
        (
            "overflowing float",
            net(("bn", [0], {"epsilon": 1})).replace('"epsilon": 1', '"epsilon": 1e999'),
            "epsilon must be a finite number",
        ),
        ("5000-digit integer", doc().replace('"units": 3', '"units": ' + "9" * 5000), "invalid JSON"),
        # wrong document shape
        ("top-level list", "[]", "must be a JSON object, got list"),
        ("top-level number", "7", "must be a JSON object, got int"),
        ("top-level null", "null", "must be a JSON object, got NoneType"),
        ("no format", json.dumps({k: v for k, v in valid.items() if k != "format"}), "'format' must be"),
        ("wrong format", doc(format="keras"), "'format' must be 'aiperf-graph', got 'keras'"),
        ("format as list", doc(format=["aiperf-graph"]), "'format' must be"),
        ("no version", json.dumps({k: v for k, v in valid.items() if k != "version"}), "version None"),
        ("future version", doc(version=2), "unsupported architecture version 2"),
        ("version as string", doc(version="1"), "unsupported architecture version '1'"),
        ("version as bool", doc(version=True), "unsupported architecture version True"),
        ("version as float", doc(version=1.0), "unsupported architecture version 1.0"),
        ("unknown top key", doc(weights=[1, 2]), "unknown key 'weights'"),
        ("name not text", doc(name=12), "'name' must be printable text"),
        ("name too long", doc(name="n" * 201), "'name' must be printable text"),
        ("name with newline", doc(name="a\nb"), "'name' must be printable text"),
        ("name with slash", doc(name="a/b"), "without '/'"),
        ("nodes missing", json.dumps({k: v for k, v in valid.items() if k != "nodes"}), "'nodes' must be a non-empty"),
        ("nodes empty", doc(nodes=[]), "'nodes' must be a non-empty list"),
        ("nodes an object", doc(nodes={"0": {}}), "'nodes' must be a non-empty list"),
        ("node a number", doc(nodes=[0, 1]), "node #0 must be an object, got int"),
        # node records
        ("node unknown key", doc(nodes=[{"id": 0, "op": "input", "attrs": {"shape": [2]}, "w": 1}]), "unknown key 'w'"),
        ("node without id", doc(nodes=[{"op": "input"}]), "node #0 needs 'id' and 'op'"),
        ("node without op", doc(nodes=[{"id": 0}]), "node #0 needs 'id' and 'op'"),
        ("op a number", net(("conv", [0], {"filters": 2})).replace('"op": "conv"', '"op": 5'), "'op' must be a string"),
        ("unknown op", net(("lstm", [0], {})), "unknown op 'lstm'"),
        ("megabyte op name", net(("x" * (1 << 20), [0], {})), "unknown op 'xxxx"),
        ("id a bool", net(("bn", [0], {})).replace('"id": 1', '"id": true'), "id must be an integer, got True"),
        ("id a float", net(("bn", [0], {})).replace('"id": 1', '"id": 1.5'), "id must be an integer, got 1.5"),
        ("id negative", net(("bn", [0], {})).replace('"id": 1', '"id": -1'), "id must be between 0"),
        ("id huge", net(("bn", [0], {})).replace('"id": 1', '"id": 100000000000000000000'), "id must be between"),
        ("id a string", net(("bn", [0], {})).replace('"id": 1', '"id": "1"'), "id must be an integer, got '1'"),
        ("duplicate ids", net(("bn", [0], {}), ("bn", [1], {})).replace('"id": 2', '"id": 1'), "duplicate id"),
        ("inputs not a list", net(("bn", 0, {})), "'inputs' must be a list, got 0"),
        ("input id a string", net(("bn", ["0"], {})), "input id must be an integer"),
        ("input id a bool", net(("bn", [False], {})), "input id must be an integer, got False"),
        ("dangling input", net(("bn", [42], {})), "input 42 does not exist"),
        ("self loop", net(("add", [0, 1], {})), "cycle"),
        ("two-node cycle", net(("add", [0, 2], {}), ("bn", [1], {})), "cycle"),
        ("concat reads one tensor twice", net(("concat", [0, 0], {})), "the same input appears twice"),
        ("add with one input", net(("add", [0], {})), "takes at least 2 inputs"),
        # attributes
        ("attrs not an object", net(("bn", [0], [])), "'attrs' must be an object"),
        ("unknown attribute", net(("conv", [0], {"filters": 2, "dilation": 2})), "unknown attribute 'dilation'"),
        ("missing filters", net(("conv", [0], {})), "missing attribute 'filters'"),
        ("a billion filters", net(("conv", [0], {"filters": 10**9})), "filters must be between 1 and 65536"),
        ("zero filters", net(("conv", [0], {"filters": 0})), "filters must be between 1"),
        ("filters a bool", net(("conv", [0], {"filters": True})), "filters must be an integer, got True"),
        ("filters a float", net(("conv", [0], {"filters": 16.0})), "filters must be an integer, got 16.0"),
        ("filters a string", net(("conv", [0], {"filters": "16"})), "filters must be an integer, got '16'"),
        ("filters an object", net(("conv", [0], {"filters": {"n": 1}})), "filters must be an integer"),
        ("kernel of three", net(("conv", [0], {"filters": 2, "kernel": [3, 3, 3]})), "kernel must be a pair"),
        ("kernel of bools", net(("conv", [0], {"filters": 2, "kernel": [True, True]})), "kernel must be an integer"),
        ("huge kernel", net(("conv", [0], {"filters": 2, "kernel": 1000})), "kernel must be between 1 and 64"),
        ("zero stride", net(("conv", [0], {"filters": 2, "strides": 0})), "strides must be between 1 and 64"),
        ("padding upper case", net(("conv", [0], {"filters": 2, "padding": "SAME"})), "padding must be one of"),
        ("groups not dividing", net(("conv", [0], {"filters": 3, "groups": 2})), "groups=2 must divide"),
        ("pool mode", net(("pool", [0], {"mode": "min"})), "mode must be one of max, avg"),
        ("dropout rate 1", net(("dropout", [0], {"rate": 1})), "rate must be in [0, 1)"),
        ("dropout rate negative", net(("dropout", [0], {"rate": -0.1})), "rate must be in [0, 1)"),
        ("dropout rate a string", net(("dropout", [0], {"rate": "0.5"})), "rate must be a finite number"),
        ("epsilon zero", net(("bn", [0], {"epsilon": 0})), "epsilon must be in (0, 1]"),
        ("activation unknown", net(("act", [0], {"fn": "mish"})), "fn must be one of"),
        ("pad of three", net(("zeropad", [0], {"pad": [1, 1, 1]})), "pad must be four integers"),
        # shapes and structure
        ("window too large", net(("conv", [0], {"filters": 2, "kernel": 9, "padding": "valid"})), "does not fit"),
        ("dense on an image", net(("dense", [0], {"units": 2}), head=False), "dense needs a flat input"),
        ("add of different shapes", net(("conv", [0], {"filters": 5}), ("add", [0, 1], {})), "add needs equal"),
        ("output is an image", net(("conv", [0], {"filters": 5}), head=False), "must be a vector of class logits"),
        (
            "two outputs",
            net(("gpool", [0], {}), ("dense", [1], {"units": 2}), ("dense", [1], {"units": 2}), head=False),
            "exactly one output, found 2",
        ),
        ("two inputs", net(("input", [], {"shape": [4, 4, 2]}), ("concat", [0, 1], {})), "exactly one input"),
        ("input shape of four dims", doc().replace("[4, 4, 2]", "[4, 4, 2, 1]"), "shape must be a list of 1 to 3"),
        ("billion-pixel input", doc().replace("[4, 4, 2]", "[1000000, 1000000, 3]"), "image side exceeds"),
        ("too many elements", doc().replace("[4, 4, 2]", "[16384, 16384, 1024]"), "out of range"),
        (
            "absurd dense",
            net(("gpool", [0], {}), ("dense", [1], {"units": 1 << 21}), head=False),
            "units must be between 1 and 1048576",
        ),
        (
            "parameter explosion",
            doc(
                nodes=[
                    {"id": 0, "op": "input", "attrs": {"shape": [1 << 20]}},
                    {"id": 1, "op": "dense", "inputs": [0], "attrs": {"units": 1 << 20}},
                    {"id": 2, "op": "dense", "inputs": [1], "attrs": {"units": 2}},
                ]
            ),
            "exceeds 17179869184 parameters",
        ),
        (
            "too many nodes",
            doc(
                nodes=[{"id": 0, "op": "input", "attrs": {"shape": [2]}}]
                + [{"id": k, "op": "bn", "inputs": [k - 1]} for k in range(1, MAX_NODES + 1)]
            ),
            f"exceed the limit of {MAX_NODES}",
        ),
        # resource exhaustion
        ("deeply nested list", nested(100_000), "nested too deeply"),
        ("nested just under the recursion limit", nested(500), "unknown key 'extra'"),
        # 14 MB, under the file cap: parsed, these would take hundreds of MB of Python objects
        ("seven million numbers", "[" + "0," * 7_000_000 + "0]", "JSON values exceed the limit"),
        ("five million objects", "[" + "{}," * 5_000_000 + "{}]", "JSON values exceed the limit"),
        ("oversized file", '{"name": "' + "a" * (serialize.MAX_FILE_BYTES + 1) + '"}', "bytes exceed the limit"),
    ]
    return cases


CORPUS = hostile_corpus()


def test_the_corpus_is_large():
    assert len(CORPUS) >= 50 and len({label for label, _, _ in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize(("label", "text", "fragment"), CORPUS, ids=[c[0] for c in CORPUS])
def test_hostile_file_is_rejected_in_one_line(label, text, fragment):
    tracemalloc.start()
    try:
        with pytest.raises(NasError) as err:
            serialize.loads(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert fragment in message, message
    assert "\n" not in message and len(message) < 400
    # Memory stays bounded: nothing near the size the description asks for is allocated.
    assert peak < 64 << 20, f"{label}: {peak / 2**20:.0f} MiB"


def test_load_names_the_file_and_refuses_non_files(tmp_path):
    bad = tmp_path / "arch.json"
    bad.write_text(net(("conv", [0], {"filters": 10**9})))
    with pytest.raises(NasError, match=r"arch\.json: .*filters must be between"):
        serialize.load(bad)
    with pytest.raises(NasError, match="no such file"):
        serialize.load(tmp_path / "missing.json")
    with pytest.raises(NasError, match="is a directory"):
        serialize.load(tmp_path)
    if os.path.exists("/dev/zero"):  # endless: must not be read
        with pytest.raises(NasError, match="not a regular file"):
            serialize.load("/dev/zero")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it would block forever
    with pytest.raises(NasError, match="not a regular file"):
        serialize.load(fifo)


def test_load_caps_the_bytes_it_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(serialize, "MAX_FILE_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(doc(name="x" * 150) + " " * 2000)
    with pytest.raises(NasError, match="exceeds the limit of 1000 bytes"):
        serialize.load(path)


def grown(seed: int, steps: int):
    rng = np.random.default_rng(seed)
    graph = zoo.small_resnet((12, 12, 3), width=4)
    for _ in range(steps):
        graph = random_morph(graph, rng)[0]
    return graph


@pytest.mark.parametrize(
    "graph",
    [zoo.small_resnet(), zoo.resnet(50), zoo.vgg(11, (32, 32, 3), 10), zoo.mobilenet_v1(), grown(0, 6), grown(1, 6)],
    ids=["small_resnet", "resnet50", "vgg11", "mobilenet_v1", "grown0", "grown1"],
)
def test_round_trip_is_exact(graph, tmp_path):
    text = serialize.dumps(graph)
    back = serialize.loads(text)
    assert back == graph and back.key() == graph.key() and back.name == graph.name
    assert [back.shape(n.id) for n in back.nodes] == [graph.shape(n.id) for n in graph.nodes]
    assert serialize.dumps(back) == text
    assert serialize.graph_from_dict(json.loads(json.dumps(serialize.graph_to_dict(graph)))) == graph
    path = tmp_path / "arch.json"
    serialize.save(graph, path)
    assert serialize.load(path) == graph
    assert json.loads(path.read_text())["version"] == serialize.VERSION


def test_a_keras_sized_network_fits_well_within_the_caps():
    text = serialize.dumps(zoo.resnet(152), indent=1)
    per_node = len(text) / len(zoo.resnet(152))
    assert per_node * MAX_NODES < serialize.MAX_FILE_BYTES
    assert serialize._count_tokens(text) / len(zoo.resnet(152)) * MAX_NODES < serialize.MAX_JSON_TOKENS


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_childs_document_shares_its_parents_unchanged_nodes_and_leaves_the_parents_as_it_was(seed):
    """Each node's document is made once (every trial writes its graph twice): a child's changed nodes get their own."""
    rng = np.random.default_rng(seed)
    parent = zoo.small_resnet((12, 12, 3), width=4)
    before = json.dumps(serialize.graph_to_dict(parent), sort_keys=True)
    child = parent
    for _ in range(3):
        child = random_morph(child, rng)[0]
    ours, theirs = serialize.graph_to_dict(child), serialize.graph_to_dict(parent)
    mine = {id(d) for d in theirs["nodes"]}
    shared = [d for d in ours["nodes"] if id(d) in mine]
    assert shared and len(shared) < len(ours["nodes"])
    assert json.dumps(serialize.graph_to_dict(parent), sort_keys=True) == before
    assert serialize.graph_from_dict(json.loads(json.dumps(ours, allow_nan=False))) == child

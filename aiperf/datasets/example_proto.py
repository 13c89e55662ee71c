"""``tf.train.Example`` without importing TensorFlow, and the TFRecord framing around it.

The head reads the labels of TFRecord shards and counts their records before any worker
starts; importing TensorFlow there for that costs seconds and a lot of memory
(benchmarks/RESULTS.md) and risks TensorFlow claiming the head's GPUs. The message is declared here
from its published schema (tensorflow/core/example/{example,feature}.proto) and parsed by
the protobuf runtime; the framing (length, masked CRC, data, masked CRC) is read with seeks.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import BinaryIO

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

HEADER_BYTES = 12  # uint64 length + uint32 masked CRC of the length
FOOTER_BYTES = 4  # uint32 masked CRC of the data

# One feature's values: a single value unwrapped, else the list (empty, or several values).
FeatureValue = bytes | int | float | list[bytes] | list[int] | list[float]


@lru_cache(maxsize=1)
def example_class() -> type[Message]:
    """The ``tensorflow.Example`` message class (same wire format as TensorFlow's)."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="aiperf/example.proto", package="aiperf_tf", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> descriptor_pb2.DescriptorProto:
        msg = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            fld = msg.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                fld.type_name = type_name
        return msg

    repeated, optional = f.LABEL_REPEATED, f.LABEL_OPTIONAL
    message("BytesList", ("value", 1, f.TYPE_BYTES, repeated, ""))
    message("FloatList", ("value", 1, f.TYPE_FLOAT, repeated, ""))
    message("Int64List", ("value", 1, f.TYPE_INT64, repeated, ""))
    feature = message(
        "Feature",
        ("bytes_list", 1, f.TYPE_MESSAGE, optional, ".aiperf_tf.BytesList"),
        ("float_list", 2, f.TYPE_MESSAGE, optional, ".aiperf_tf.FloatList"),
        ("int64_list", 3, f.TYPE_MESSAGE, optional, ".aiperf_tf.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for fld in feature.field:
        fld.oneof_index = 0
    features = message("Features", ("feature", 1, f.TYPE_MESSAGE, repeated, ".aiperf_tf.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=f.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=f.TYPE_MESSAGE, label=optional, type_name=".aiperf_tf.Feature")
    entry.options.map_entry = True
    message("Example", ("features", 1, f.TYPE_MESSAGE, optional, ".aiperf_tf.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("aiperf_tf.Example"))


def parse_features(record: bytes) -> dict[str, FeatureValue]:
    """A serialized Example as ``{key: bytes | int | float | list}`` (single values unwrapped)."""
    example = example_class()()
    example.ParseFromString(record)
    out: dict[str, FeatureValue] = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        out[key] = values[0] if len(values) == 1 else values
    return out


def record_spans(fh: BinaryIO, size: int) -> list[tuple[int, int]]:
    """``(data offset, data length)`` of every record in a TFRecord file of ``size`` bytes.

    Reads only the 12-byte headers and seeks over the data, so counting a 140 MB shard costs
    about a thousand small reads. Raises ``ValueError`` where the framing does not add up
    (a truncated or foreign file).
    """
    spans = []
    offset = 0
    while offset < size:
        fh.seek(offset)
        header = fh.read(HEADER_BYTES)
        if len(header) < HEADER_BYTES:
            raise ValueError(f"truncated record header at byte {offset}")
        (length,) = struct.unpack("<Q", header[:8])
        end = offset + HEADER_BYTES + length + FOOTER_BYTES
        if end > size:
            raise ValueError(f"the record at byte {offset} claims {length:,} bytes, past the end of the file")
        spans.append((offset + HEADER_BYTES, length))
        offset = end
    return spans

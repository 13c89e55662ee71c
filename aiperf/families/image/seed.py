"""The image search's starting architecture: a zoo network or an architecture file, sized to the dataset."""

from __future__ import annotations

import os

from aiperf.config import Config
from aiperf.datasets import Dataset
from aiperf.errors import AiperfError
from nas.errors import NasError
from nas.graph import Graph


def seed_architecture(cfg: Config, dataset: Dataset) -> Graph:
    """The search's starting architecture, sized to the dataset's images and classes.

    It always carries a dropout layer before its classifier (inserted if the architecture
    has none), so the searched dropout rate reaches every trial.
    """
    return _seed_graph(cfg, dataset).with_dropout(cfg.train.dropout, ensure=True)


def _seed_graph(cfg: Config, dataset: Dataset) -> Graph:
    from nas import serialize, zoo

    name = cfg.model.seed_architecture
    try:
        if name.endswith(".json") or os.sep in name:
            graph = serialize.load(name)
            if tuple(graph.input_shape) != tuple(dataset.input_shape) or graph.num_classes != dataset.num_classes:
                raise AiperfError(
                    f"model.seed_architecture: {name} takes {graph.input_shape} images and {graph.num_classes} classes,"
                    f" but the dataset has {tuple(dataset.input_shape)} and {dataset.num_classes}"
                )
            return graph
        if name == "small_resnet":
            return zoo.small_resnet(
                dataset.input_shape, dataset.num_classes, width=cfg.model.width, dropout=cfg.train.dropout
            )
        return zoo.by_name(name, dataset.input_shape, dataset.num_classes)
    except NasError as exc:
        raise AiperfError(f"model.seed_architecture: {exc}") from None

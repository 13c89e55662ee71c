"""Image classification datasets read from local files or installed packages, never the network.

``load_dataset(cfg.dataset)`` returns a :class:`Dataset` with a seeded, disjoint
train/validation split; ``decode_image`` decodes one file for streamed datasets.
"""

from aiperf.datasets.base import Dataset
from aiperf.datasets.images import decode_image
from aiperf.datasets.load import load_dataset

__all__ = ["Dataset", "decode_image", "load_dataset"]

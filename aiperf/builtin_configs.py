"""The names of the configs shipped in ``aiperf/configs/`` (``--config NAME``): one list for the loader and the help.

A module of its own, with no imports, so ``aiperf --help`` names them without loading the
config's models (pydantic costs about 0.2 s of a start-up).
"""

BUILTIN_CONFIGS = (
    "default",
    "smoke",
    "imagenet",
    "fashion_mnist",
    "synthetic",
    "llm",
    "llm-official",
    "gpu",
    "cpu-standin",
)

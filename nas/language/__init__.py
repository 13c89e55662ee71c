"""The language family's search space: transformer specs, their morphs, FLOPs, distance, TPE and search.

Pure like the rest of :mod:`nas` (no framework); the image family's space is the graph at the package's top.
"""

"""Running trials on a Ray cluster: session, discovery, sizing, workers and the pool."""

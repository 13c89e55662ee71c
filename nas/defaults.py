"""The search's default settings, in one place: the run config (``aiperf.config``) reads them too.

A tiny module with no imports, so that the config (loaded by every command) does not pay for
importing the search itself (SciPy and Optuna: about 0.75 s).
"""

# Training hyperparameters a trial uses unless the search or the config says otherwise.
DEFAULT_HPARAMS = {
    "learning_rate": 0.05,
    "batch_size": 128,
    "weight_decay": 5e-4,
    "dropout": 0.0,
    "kernel_size": 3,
    "epochs": 3,
}

# The ranges TPE samples from when a trial re-tunes an architecture.
HPARAM_RANGES = {
    "learning_rate": (1e-3, 0.2),
    "weight_decay": (1e-6, 1e-2),
    "dropout": (0.0, 0.5),
    "batch_sizes": (32, 64, 128, 256),
    "kernel_sizes": (1, 3, 5),
    "epochs": (1, 4),
}

# How architectures are proposed.
STRATEGIES = ("bayesian", "random")
SEARCH = {
    "strategy": "bayesian",
    "ucb_beta": 2.0,
    "retune_fraction": 0.25,
    "max_morphs_per_child": 2,
    "gp_window": 256,
    "candidates": 64,
}

"""Submission packages: ``aiperf package`` writes one from verified, audited runs, ``aiperf check`` checks one.

The layout (``layout``) is the contract between the two and ``aiperf list``: docs/submission.md.
"""

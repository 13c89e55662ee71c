"""What a run samples while it goes, beside its ledger: per-node telemetry and the energy read from it."""

"""Views of a finished (or killed) run, computed from its ledger alone: summary, verify, report, tables, log."""

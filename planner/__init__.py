"""Staleness planning for async RL: policies, simulator, ledger and audit. Pure Python + NumPy."""

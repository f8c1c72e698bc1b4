"""Turning run directories into answers: accuracy per joule, regressions, sweeps."""

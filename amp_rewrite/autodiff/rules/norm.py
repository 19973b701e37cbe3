"""Gradient rules: norm (being written)."""

"""Gradient rules: movement (being written)."""

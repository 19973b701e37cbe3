"""Gradient rules: conv (being written)."""

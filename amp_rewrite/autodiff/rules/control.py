"""Gradient rules: control (being written)."""

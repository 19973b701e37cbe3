"""Builders for amp-rewrite's sample and test models."""

"""Lamina's client (filled in below)."""

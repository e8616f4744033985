"""Timed runs of drafts next to plain decoding, metrics, reports and promotion gates (see docs/ARCHITECTURE.md)."""

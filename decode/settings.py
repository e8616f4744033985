"""Choices of the decode engine's options, importable without torch (config schemas use them)."""

BACKENDS = ("auto", "lean", "hf")  # cached forward of the decode loops: see decode/runners.py

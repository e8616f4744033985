"""eval package (see DESIGN.md)."""

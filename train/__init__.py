"""train package (see DESIGN.md)."""

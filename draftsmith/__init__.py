"""draftsmith package (see DESIGN.md)."""

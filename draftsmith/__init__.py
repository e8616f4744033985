"""The spine: the Hydra app, config schema, pipeline, registry, tracking and demo (see docs/ARCHITECTURE.md)."""

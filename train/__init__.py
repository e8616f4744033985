"""datagen from the target, distillation losses and the training loop (see docs/ARCHITECTURE.md)."""

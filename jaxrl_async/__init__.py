"""JAX async RL trainer: models, losses, generation engines, async runtime."""

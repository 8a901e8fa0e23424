"""Ways to start a training job: `python -m launch <target> [--dry-run] [options] [hydra overrides]`."""

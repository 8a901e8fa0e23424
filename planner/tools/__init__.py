"""Command-line tools shared by the planner's and the trainer's entry points (entry: errors and --help)."""

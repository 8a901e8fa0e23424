"""The planner's commands and analyses: simulate, compare, tune, calibrate, audit, plots, fidelity."""

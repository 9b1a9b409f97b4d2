"""gpurm cli."""

"""gpurm am."""

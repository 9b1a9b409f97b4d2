"""gpurm nodeagent."""

"""gpurm: a resource manager for shared GPU clusters that run deep-learning training.

Its sub-packages are the project's top-level folders: rm/, am/, nodeagent/, queues/, sim/, cli/ and proto/ at the
repository root are links into this folder, kept so that the layout of the design card reads as before (see
docs/ARCHITECTURE.md, "Layout").
"""

"""The RM's pure state machine (RMCore) and its parts: records in motion, the cluster and queue books, nodes,
containers, AM launching, recovery and views. No clock, no I/O."""

"""Who calls and what they may hold: caller identity, credentials the RM hands out, the cluster PKI, broker roles."""

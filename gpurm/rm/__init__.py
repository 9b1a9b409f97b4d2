"""The ResourceManager: cluster model, scheduler core, job records, store, gRPC services and the daemon."""

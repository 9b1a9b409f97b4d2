"""The RM as a server: the asyncio daemon around the core, the process, gRPC services, the standby and leadership, MQTT
publishing and the broker, the views and pages it serves, metrics."""

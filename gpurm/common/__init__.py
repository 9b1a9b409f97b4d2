"""What the RM, the agent, the AM and the CLI share: asyncio helpers, TLS, tokens, limits, retries, text escaping,
config fields, the job spec, the records and the GPU model, MQTT plumbing."""

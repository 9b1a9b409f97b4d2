"""Queue admin config: YAML loading and validation, the queue tree, and the fair-share math."""

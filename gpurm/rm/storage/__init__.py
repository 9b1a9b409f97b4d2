"""The RM's stores and their care: SQLite and PostgreSQL, the store URL, the group-commit writer, fail-closed
persistence, records, retention tables, the state dir, offline admin."""

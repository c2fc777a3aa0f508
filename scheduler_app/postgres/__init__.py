"""What exists only for PostgreSQL through psycopg 3: fixed claim statements, batched journal writes,
the one-statement manual trigger, and the server-bound cursor they run on (docs/architecture.md)."""

"""What every part of brooq_py.postgres runs on (docs/development.md maps the modules); it imports
psycopg and ``brooq_py.queue`` only."""

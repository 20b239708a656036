"""What every part of brooq_py.postgres runs on: ``statements`` (the named SQL rendered per schema,
the channels, batch parameters, rows as ``JobRow``), ``tx`` (statements on a connection or a
caller's transaction; plans driven), ``connections`` (``Session``, ``AsyncSession``, the Store's own
connections and their bounds, SPEC L3), ``errors`` (psycopg's errors translated, H1). It imports
psycopg and ``brooq_py.queue`` only.
"""

"""The session layer: what every other part of brooq_py.postgres runs on.

- ``statements``: the named SQL of ``sql/*.sql`` rendered per schema, the NOTIFY
  channels, the array literals of batch parameters, rows decoded into ``JobRow``;
- ``tx``: running a statement on a connection, on a caller's transaction
  (``WrapTx``, ``AsyncWrapTx``, a foreign ``Tx``), and driving I/O-free plans;
- ``connections``: the pool plumbing shared by the Store's roles, the Store's
  own connections and the bounds on their waits (SPEC L3);
- ``errors``: psycopg's errors translated at the edge (SPEC H1).

It imports psycopg and ``brooq_py.queue`` only, never another folder of brooq_py.postgres.
"""

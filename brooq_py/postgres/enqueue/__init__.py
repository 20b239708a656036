"""The producer's rules as I/O-free plans, written once for the Store and the AsyncStore: ``jobs``
(one, many, a group), ``plans`` (one job's statements, the reads of jobs), ``unique`` (U1, U2),
``workflows`` (D1, D6); and ``producer``, the Store's part that drives them. It imports ``session``
and ``flow``.
"""

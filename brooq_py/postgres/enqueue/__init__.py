"""The producer's rules, written once as I/O-free plans for the Store and the AsyncStore.

- ``jobs``: ``enqueue_one``, ``enqueue_many``, ``enqueue_group`` (SPEC E1-E5, D6);
- ``plans``: one job's statements (the fast paths, validation) and the plans that
  read one job or a list of them;
- ``unique``: jobs with a unique key (U1, U2); ``workflows``: jobs that name parents (D1).

It imports ``session`` and ``flow`` (a capped topic's depth, F2), never the Stores.
"""

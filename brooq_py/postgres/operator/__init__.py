"""What an operator does and reads: retry, pause, topics, the dashboard's pages, stats.

- ``actions``: retry, pause and resume, set_limit, list and overview (SPEC Q1-Q3);
- ``overview``: the dashboard's and ``GET /topics``' bounded reads;
- ``stats``: ``brooq-py stats`` and the README's operator SQL, runnable from code (O3).

It imports ``session``, ``enqueue`` (the reads of a job) and ``flow``; the Stores, never.
"""

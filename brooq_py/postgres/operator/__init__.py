"""What an operator reads and does: ``actions`` (the Store's ``Operator`` part: retry, list, the
topics), ``overview`` (the dashboard's bounded reads), ``stats`` (``brooq-py stats`` and the
README's operator SQL). It imports ``session``, ``enqueue`` and ``flow``.
"""

"""HTTP: the worker's surface (/healthz, /metrics, /jobs, /topics) and the dashboard (/ui).

``api``, ``auth``, ``actions`` and ``server`` need the standard library only; ``asgi``,
``dashboard`` and ``render`` need the ``web`` extra, so ``server`` imports them lazily.
The public names live in ``brooq_py.service`` and ``brooq_py.web`` (docs/development.md).
"""

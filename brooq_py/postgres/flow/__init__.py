"""Flow control (SPEC Q2, Q3, F1, F2): ``limits``, a topic's settings (the Store's ``Flow`` part and
the checks of their values); ``caps``, the depth caps a store caches. It imports ``session``.
"""

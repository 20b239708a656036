"""Flow control (SPEC Q2, Q3, F1, F2): a topic's settings and its depth caps; it imports ``session``."""

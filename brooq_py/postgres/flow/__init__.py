"""Flow control: global concurrency limits, rate limits and depth caps (SPEC Q3, F1, F2).

``limits`` holds the values as the Store checks and shows them, the depth caps a
Store caches, and the Store's setters. It imports ``session`` only.
"""

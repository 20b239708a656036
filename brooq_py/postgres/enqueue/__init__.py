"""The producer's rules as I/O-free plans, written once for the Store and the AsyncStore, and the
``Producer`` part that drives them (docs/development.md); it imports ``session`` and ``flow``."""

"""What an operator reads and does (docs/development.md maps the modules); it imports ``session``,
``enqueue`` and ``flow``."""

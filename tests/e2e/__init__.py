"""End-to-end tests: the ``scaledl`` command run as a subprocess."""

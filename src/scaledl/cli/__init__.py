"""The ``scaledl`` command line: ``scaledl bench collectives ...`` (``train``, ``simulate`` and
``cluster`` join as modules with ``add_parser(subparsers)`` and ``run(args) -> int``)."""

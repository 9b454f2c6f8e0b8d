"""``python -m sim.app.cli``: the ``servesim`` command line."""

from sim.app.cli.launch import main

main()

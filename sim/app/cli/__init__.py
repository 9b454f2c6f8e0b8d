"""The ``servesim`` command line (sim/app/cli/main.py has the app and its commands)."""

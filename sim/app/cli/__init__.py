"""The ``servesim`` command line (sim/app/cli/main.py has the app and its commands;
sim/app/cli/launch.py is the console script)."""

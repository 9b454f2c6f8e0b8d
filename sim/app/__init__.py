"""The application over the engine: the command line (cli/), what it runs (runs/: one run,
compare, sweep, plan, validate, process pools, output staging) and what it draws (reports/)."""

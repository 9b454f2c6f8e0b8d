"""What the commands run: a prepared run, compare, sweep, plan, validate; process pools; output
staging. Draws nothing: pages live in sim/app/reports/."""

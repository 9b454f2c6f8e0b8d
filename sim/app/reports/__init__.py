"""What the commands draw: the HTML report, the slot diagram, the sweep, plan and validation
pages, and the run directory they read."""

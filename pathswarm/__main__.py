"""`python -m pathswarm` runs the CLI."""

from pathswarm.node.app.cli import main

main()

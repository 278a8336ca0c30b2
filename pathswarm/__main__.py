"""`python -m pathswarm` runs the CLI."""

from pathswarm.node.cli import main

main()

"""Subcommands of `omni-ros`, one module each.

A module here defines `register(sub)` that adds its parser to the argparse
subparsers and sets `func`; heavy imports stay inside the handlers so
`omni-ros --help` stays instant.
"""

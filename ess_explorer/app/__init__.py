"""Applications on top of the library: the Jupyter explorer (widget.py), the %ess magic
(magic.py), the command line (cli.py) and the standalone HTML report (report.py)."""

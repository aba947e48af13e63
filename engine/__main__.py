"""`python -m lanner ...` is the `lanner` command."""
import sys

from lanner.cli import main

sys.exit(main())

"""python -m ferry == the ferry command."""
import sys

from .cli import main

sys.exit(main())

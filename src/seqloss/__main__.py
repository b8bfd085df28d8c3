"""``python -m seqloss``: the ``seqloss`` command."""

import sys

from .cli import main

sys.exit(main())

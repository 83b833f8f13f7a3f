"""``python -m handofflock``: the ``handofflock`` command."""

import sys

from .cli import main

sys.exit(main())

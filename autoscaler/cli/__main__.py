"""``python -m spotring.autoscaler.cli``: the ``spotring`` command."""

import sys

from spotring.autoscaler.cli.entry import main

sys.exit(main())

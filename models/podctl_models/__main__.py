"""`python -m podctl_models ...` is the exporter."""

import sys

from .export import main

sys.exit(main())

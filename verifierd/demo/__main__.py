"""`python -m verifierd.demo` (what `make demo` runs). See verifierd/demo/run.py."""

from __future__ import annotations

import sys

from verifierd.demo.run import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench [--quick] [--n N] [--duration S] [--out DIR]`."""

from bench.cli import main

raise SystemExit(main())

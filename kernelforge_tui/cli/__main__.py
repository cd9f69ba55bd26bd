"""`python -m kernelforge_tui.cli`: the same as the `kernelforge` script."""

from kernelforge_tui.cli.main import main

raise SystemExit(main())

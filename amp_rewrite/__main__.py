import sys

from amp_rewrite.cli import main

sys.exit(main())

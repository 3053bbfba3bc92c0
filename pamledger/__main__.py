import sys

from pamledger.cli import main

sys.exit(main())

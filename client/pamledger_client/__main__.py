import sys

from pamledger_client.cli import main

sys.exit(main())

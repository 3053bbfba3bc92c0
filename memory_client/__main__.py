import sys

from memory_client.cli import main

sys.exit(main())

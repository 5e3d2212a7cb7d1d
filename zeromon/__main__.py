import sys

from zeromon.cli import main

sys.exit(main())

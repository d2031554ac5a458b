import sys

from tests.chaos.driver import main

sys.exit(main())

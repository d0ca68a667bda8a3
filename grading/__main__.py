import sys

from grading import main

sys.exit(main())

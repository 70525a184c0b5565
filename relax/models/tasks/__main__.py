import sys

from relax.models.tasks import main

sys.exit(main())

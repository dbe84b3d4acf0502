import sys

from tools.kaggle_emulator.cli import main

sys.exit(main())

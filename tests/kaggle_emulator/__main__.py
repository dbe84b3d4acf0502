import sys

from kaggle_emulator.cli import main

sys.exit(main())

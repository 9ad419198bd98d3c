"""`python -m trainer.convert INPUT_DIR OUTPUT_DIR [options]`: the converter's command (`trainer.data.convert`)."""

import sys

from trainer.data.convert import main

if __name__ == "__main__":
    sys.exit(main())

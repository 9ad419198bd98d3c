"""`python -m trainer.convert INPUT_DIR OUTPUT_DIR [options]`: the converter's command
(`trainer.data.folder_to_records`).

TensorFlow (the one decode) is imported quietly first, unless `--tf-logs` asks for its start-up lines.
"""

import sys

from trainer import quiet

if __name__ == "__main__":
    quiet.configure("--tf-logs" in sys.argv[1:])
    quiet.import_tensorflow()
    from trainer.data.folder_to_records import main

    sys.exit(main())

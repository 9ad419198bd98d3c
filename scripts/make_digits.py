"""Regenerates the bundled demo data, `trainer/data/digits/{train,test}.bin`.

    pip install scikit-learn && python scripts/make_digits.py

The 1,797 8x8 handwritten digits that scikit-learn ships (UCI optdigits,
pixel values 0..16) become fixed-length records: 1 label byte, then 64 pixel
bytes scaled to 0..255. A seeded, per-class split keeps 20% for the test file.
"""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

OUT = Path(__file__).resolve().parents[1] / "trainer" / "data" / "digits"
TEST_FRACTION = 0.2
SEED = 0


def main() -> None:
    digits = load_digits()
    pixels = np.rint(digits.data * 255.0 / 16.0).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    rng = np.random.default_rng(SEED)
    test = np.zeros(len(labels), dtype=bool)
    for label in range(10):
        members = np.flatnonzero(labels == label)
        test[rng.choice(members, int(round(len(members) * TEST_FRACTION)), replace=False)] = True
    OUT.mkdir(parents=True, exist_ok=True)
    for name, mask in (("train", ~test), ("test", test)):
        order = rng.permutation(np.flatnonzero(mask))  # mix classes within each file
        records = np.concatenate([labels[order, None], pixels[order]], axis=1)
        (OUT / f"{name}.bin").write_bytes(records.tobytes())
        print(f"{OUT / name}.bin: {len(order)} records")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the .npz archives that tests/kernels/npz_test.cpp loads, with NumPy's own writers.

    /usr/bin/python3 tests/kernels/golden/make_npz_golden.py [--out DIR]

NumPy is not a dependency of troupe: only this generator needs it, and its output is committed
(tests/kernels/golden/npz/, about 3 KB). On Debian: apt-get install python3-numpy. The files
show that load_npz reads what np.savez (stored entries) and np.savez_compressed (deflated)
write, zip64 extra fields included (NumPy forces them on every entry), and what they write to a
stream that cannot seek (sizes and CRCs in data descriptors after each entry).

The values follow formulas that the test recomputes:

    savez.npz             np.savez: x_train uint8 (6, 4, 5) = (i*7 + j*3 + k) % 256,
                          y_train int64 i % 3, x_test uint8 (2, 4, 5) = (i*11 + j + k*5) % 256,
                          y_test int64 (i + 1) % 3, client_train int64 (0, 2, 2, 0, 5, 2)
    savez_compressed.npz  np.savez_compressed: x_train float32 (5, 3) = i - 0.25*j,
                          y_train int32 (4 - i) % 4, x_test float32 (2, 3) = 0.5*i + j,
                          y_test uint8 (1, 3)
    stream.npz            np.savez_compressed into a stream that cannot seek: x_train uint8
                          (3, 2) = i + 10*j, y_train int64 (2, 0, 1), x_test uint8 ((7, 9),),
                          y_test int64 (1,)

Exits 2 with a message when numpy cannot be imported, 1 on other errors.
"""

import argparse
import io
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "npz"))
    args = parser.parse_args()
    try:
        import numpy as np
    except ImportError:
        print("make_npz_golden: numpy is missing (apt-get install python3-numpy)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)

    i, j, k = np.indices((6, 4, 5))
    x_train = ((i * 7 + j * 3 + k) % 256).astype(np.uint8)
    y_train = (np.arange(6) % 3).astype(np.int64)
    i, j, k = np.indices((2, 4, 5))
    x_test = ((i * 11 + j + k * 5) % 256).astype(np.uint8)
    y_test = ((np.arange(2) + 1) % 3).astype(np.int64)
    client_train = np.array([0, 2, 2, 0, 5, 2], dtype=np.int64)
    np.savez(os.path.join(args.out, "savez.npz"), x_train=x_train, y_train=y_train, x_test=x_test,
             y_test=y_test, client_train=client_train)

    i, j = np.indices((5, 3))
    x_train = (i - 0.25 * j).astype(np.float32)
    y_train = ((4 - np.arange(5)) % 4).astype(np.int32)
    i, j = np.indices((2, 3))
    x_test = (0.5 * i + j).astype(np.float32)
    y_test = np.array([1, 3], dtype=np.uint8)
    np.savez_compressed(os.path.join(args.out, "savez_compressed.npz"), x_train=x_train, y_train=y_train,
                        x_test=x_test, y_test=y_test)
    class Unseekable(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def writable(self):
            return True

        def write(self, b):
            return self.f.write(b)

    i, j = np.indices((3, 2))
    with open(os.path.join(args.out, "stream.npz"), "wb") as f:
        np.savez_compressed(Unseekable(f), x_train=(i + 10 * j).astype(np.uint8), y_train=np.array([2, 0, 1]),
                            x_test=np.array([[7, 9]], dtype=np.uint8), y_test=np.array([1]))
    print("make_npz_golden: wrote savez.npz, savez_compressed.npz and stream.npz to", args.out, "with numpy", np.__version__)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - one line instead of a traceback
        print("make_npz_golden:", e, file=sys.stderr)
        sys.exit(1)

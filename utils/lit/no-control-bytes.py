#!/usr/bin/env python3
"""no-control-bytes FILE...: succeeds only if no FILE holds ESC or BEL.

A name or message that came from a hostile repository or trace must reach
the terminal escaped: one raw ESC can clear the screen or recolour what
follows, one BEL rings. Tests of escaping run Ekka with such bytes in its
input and check its output with this. On a byte found, says which file and
at what offset, and exits 1.
"""
import sys

CONTROL = {0x07: "BEL", 0x1B: "ESC"}


def main(paths):
    if not paths:
        print("no-control-bytes: give one or more files", file=sys.stderr)
        return 2
    found = False
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        for offset, byte in enumerate(data):
            if byte in CONTROL:
                print("no-control-bytes: {0} holds {1} at byte {2}".format(
                    path, CONTROL[byte], offset), file=sys.stderr)
                found = True
                break
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

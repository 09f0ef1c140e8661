"""Writes the MXNet RecordIO image files the tests read (tests/data/*.rec), with MXNet's own
writer, as `im2rec --pass-through` writes them: for each row of an im2rec list file
(index, label or labels, path; tab-separated), mxnet.recordio.pack(IRHeader(0, label, index, 0),
the image's bytes) written by mxnet.recordio.MXIndexedRecordIO (NAME.rec and its NAME.idx).

Run with MXNet installed (1.9.1, the last release: `pip install mxnet==1.9.1 "numpy<1.24"` in a
virtualenv of its own), from the folder the list's paths are relative to:

    python make_mxnet_rec.py digits.lst OUT/digits     # -> OUT/digits.rec, OUT/digits.idx
"""

import sys

import mxnet as mx


def main(list_file: str, prefix: str) -> None:
    record = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    with open(list_file) as rows:
        for row in rows:
            index, *labels, path = row.rstrip("\n").split("\t")
            label = float(labels[0]) if len(labels) == 1 else [float(v) for v in labels]
            with open(path, "rb") as image:
                record.write_idx(int(index), mx.recordio.pack(mx.recordio.IRHeader(0, label, int(index), 0),
                                                              image.read()))
    record.close()
    print(f"wrote {prefix}.rec and {prefix}.idx with MXNet {mx.__version__}")


if __name__ == "__main__":
    main(*sys.argv[1:])

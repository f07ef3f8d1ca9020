#!/usr/bin/env python3
"""The data pipeline of mxnet-rt vs stock MXNet 1.9.1 (the same stock Python frontend on both
libraries): `gluon.data.DataLoader` batches/s with 0 and 2 worker processes (batches cross
processes as shared-memory arrays), RecordIO write and read MB/s, and `CSVIter` /
`MNISTIter` batches/s, and `ImageRecordIter` and `ImageDetRecordIter` images/s over 256×256
JPEGs the benchmark writes (decode, augment, normalise, batch). Each repetition is a fresh interpreter; the libraries alternate to share
the machine's noise. Medians; Markdown on stdout and in bench/results/data.md.

    .venv/bin/python bench/data_bench.py [repetitions]
"""
import os
import statistics
import sys
import tempfile

import numpy as np

from common import libraries, run_python, write_result

CHILD = r"""
import json, os, sys, time
import mxnet as mx, numpy as np
from mxnet import gluon, recordio
d = sys.argv[1]
out = {}

# DataLoader: 2048 samples of 3x64x64 float32 (48 KiB each), batch 32: 64 batches per epoch.
X = mx.nd.array(np.random.RandomState(0).uniform(size=(2048, 3, 64, 64)).astype('float32'))
Y = mx.nd.arange(2048)
ds = gluon.data.ArrayDataset(X, Y)
for workers in (0, 2):
    loader = gluon.data.DataLoader(ds, batch_size=32, num_workers=workers)
    for b in loader:  # warm up: workers started, pool allocated
        pass
    t = time.perf_counter()
    n = 0
    for _ in range(3):
        for data, label in loader:
            data.wait_to_read()
            n += 1
    out[f'loader{workers}'] = n / (time.perf_counter() - t)
    del loader

# RecordIO: 4000 records of 16 KiB.
rec = os.path.join(d, f'bench-{os.getpid()}.rec')
payload = [os.urandom(16384) for _ in range(64)]
t = time.perf_counter()
w = recordio.MXRecordIO(rec, 'w')
for i in range(4000):
    w.write(payload[i % 64])
w.close()
out['rec_write'] = 4000 * 16384 / 2**20 / (time.perf_counter() - t)
t = time.perf_counter()
r = recordio.MXRecordIO(rec, 'r')
k = 0
while r.read() is not None:
    k += 1
r.close()
assert k == 4000
out['rec_read'] = 4000 * 16384 / 2**20 / (time.perf_counter() - t)
os.remove(rec)

# Iterators over the files the driver wrote.
def rate(make, epochs=3):
    it = make()
    t = time.perf_counter()
    n = 0
    for _ in range(epochs):
        it.reset()
        for b in it:
            b.data[0].wait_to_read()
            n += 1
    return n / (time.perf_counter() - t)
out['csv'] = rate(lambda: mx.io.CSVIter(data_csv=os.path.join(d, 'data.csv'), data_shape=(64,), batch_size=100))
out['mnist'] = rate(lambda: mx.io.MNISTIter(image=os.path.join(d, 'img-idx3'), label=os.path.join(d, 'lab-idx1'),
                                            batch_size=100, shuffle=False, silent=True))

# ImageRecordIter: 384 JPEGs of 256x256 (quality 90), batch 32, default preprocess_threads.
def images(make=mx.io.ImageRecordIter, rec='img.rec', **kw):
    it = make(path_imgrec=os.path.join(d, rec), batch_size=32, **kw)
    next(iter(it))  # warm up: threads started, first batch decoded
    it.reset()
    t = time.perf_counter()
    n = 0
    for _ in range(2):
        it.reset()
        for b in it:
            b.data[0].wait_to_read()
            n += 32 - b.pad
    return n / (time.perf_counter() - t)
out['imgrec_train'] = images(data_shape=(3, 224, 224), rand_crop=True, rand_mirror=True, mean_r=123.68, mean_g=116.28,
                             mean_b=103.53, std_r=58.395, std_g=57.12, std_b=57.375)
out['imgrec_resize'] = images(data_shape=(3, 224, 224), resize=224, mean_r=123.68, mean_g=116.28, mean_b=103.53)
# ImageDetRecordIter (SSD-style): the same JPEGs with two boxes each, forced to 300x300,
# mirrored with probability 0.5, mean-subtracted.
out['imgdet'] = images(make=mx.io.ImageDetRecordIter, rec='det.rec', data_shape=(3, 300, 300), rand_mirror_prob=0.5,
                       mean_r=123.68, mean_g=116.28, mean_b=103.53)
print(json.dumps(out))
"""

ROWS = [
    ("loader0", "`DataLoader`, 0 workers, batch 32 of 3×64×64 float32 (batches/s)", True),
    ("loader2", "`DataLoader`, 2 worker processes, same batches (batches/s)", True),
    ("rec_write", "RecordIO write, 4000 records of 16 KiB (MB/s)", True),
    ("rec_read", "RecordIO read, same file (MB/s)", True),
    ("csv", "`CSVIter`, 20,000 rows of 64 floats, batch 100 (batches/s)", True),
    ("mnist", "`MNISTIter`, 10,000 28×28 images, batch 100 (batches/s)", True),
    ("imgrec_train", "`ImageRecordIter`, 256×256 JPEGs → 3×224×224, random crop + mirror + mean/std (images/s)", True),
    ("imgrec_resize", "`ImageRecordIter`, same JPEGs, resize shorter edge to 224 + centre crop (images/s)", True),
    ("imgdet", "`ImageDetRecordIter`, same JPEGs with 2 boxes, force 300×300 + mirror p=0.5 + mean (images/s)", True),
]


def files(d):
    rs = np.random.RandomState(0)
    np.savetxt(os.path.join(d, "data.csv"), rs.uniform(-1, 1, (20000, 64)), delimiter=",", fmt="%.5f")
    with open(os.path.join(d, "img-idx3"), "wb") as f:
        f.write(np.array([0x803, 10000, 28, 28], dtype=">u4").tobytes() + rs.randint(0, 256, (10000, 28, 28)).astype(np.uint8).tobytes())
    with open(os.path.join(d, "lab-idx1"), "wb") as f:
        f.write(np.array([0x801, 10000], dtype=">u4").tobytes() + rs.randint(0, 10, 10000).astype(np.uint8).tobytes())
    jpeg_records(os.path.join(d, "img.rec"), rs)
    jpeg_records(os.path.join(d, "det.rec"), np.random.RandomState(1), det=True)


def jpeg_records(path, rs, n=384, size=256, det=False):
    """`n` photograph-like JPEGs (smooth gradients, blotches and grain) in a RecordIO file;
    labelled with a class, or with `det` a detection label of two boxes."""
    import io
    from PIL import Image  # pip install pillow (scripts/env.sh installs it with the tests)
    import mxnet as mx  # stock's frontend only packs records here

    y, x = np.mgrid[0:size, 0:size]
    w = mx.recordio.MXRecordIO(path, "w")
    for i in range(n):
        base = np.stack([x * (1 + i % 3), y * (1 + i % 5), (x + y) / 2], -1) * 255 / (2 * size)
        blotch = rs.normal(0, 30, (size // 16, size // 16, 3)).repeat(16, 0).repeat(16, 1)
        img = np.clip(base + blotch + rs.normal(0, 8, (size, size, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        label = [2, 5, i % 10, 0.1, 0.2, 0.6, 0.7, 1, 0.3, 0.1, 0.9, 0.5] if det else float(i % 10)
        w.write(mx.recordio.pack(mx.recordio.IRHeader(0, label, i, 0), buf.getvalue()))
    w.close()


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    libs = libraries()
    runs = {k: [] for k in libs}
    with tempfile.TemporaryDirectory() as d:
        files(d)
        for _ in range(reps):
            for name, lib in libs.items():
                runs[name].append(run_python(name, lib, CHILD, d))
    ours, stock = ("mxnet-rt", "stock 1.9.1")
    med = {k: {key: statistics.median(r[key] for r in runs[k]) for key, _, _ in ROWS} for k in runs}
    load = os.getloadavg()[0]
    lines = [f"Medians of {reps} fresh interpreters each, libraries alternating ({os.cpu_count()} CPUs, load average "
             f"{load:.1f} at the end). Higher is better in every row; the ratio is ours / stock.", "",
             "| measurement | mxnet-rt | stock 1.9.1 | ours / stock |", "|---|---|---|---|"]
    for key, what, _ in ROWS:
        a, b = med[ours][key], med[stock][key]
        lines.append(f"| {what} | {a:.1f} | {b:.1f} | {a / b:.2f}× |")
    write_result("data.md", "\n".join(lines))


if __name__ == "__main__":
    main()

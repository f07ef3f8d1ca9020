"""RecordIO through the stock 1.9.1 frontend (`mx.recordio`), on this library against stock's
(issue 36).

Each library writes the same records (empty ones, ones holding the magic number at aligned and
unaligned offsets, a large one, `pack`ed headers with scalar and vector labels) with
`MXRecordIO` and `MXIndexedRecordIO`: the two `.rec` and `.idx` files must be equal byte for
byte, and each library reads the other's file back to the same records, sequentially and by
index. Then this library alone: damaged files (truncated, wrong magic, an index past the end,
a missing file) give clear errors, and a forked child reopens an inherited reader and closes
an inherited writer without writing its parent's buffered records again.
(`pack_img`/`unpack_img` are `pack`/`unpack` around OpenCV in the frontend; they need `cv2`,
which the test environment does not install.)
"""
import os
import struct
import subprocess
import sys

import pytest

from differential import assert_same_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: this would compare stock with itself")

MAGIC = struct.pack("<I", 0xCED7230A)

WRITE = r"""
import sys, struct, pickle
import numpy as np
import mxnet as mx
from mxnet import recordio
magic = struct.pack('<I', 0xced7230a)
rec, idx = sys.argv[1], sys.argv[2]
records = [b'', b'a', b'abcd', magic, magic + b'xy', b'1234' + magic + magic + b'tail!', b'12' + magic + b'34',
           b'abcd' + magic, bytes(range(256)) * 300]
w = recordio.MXRecordIO(rec + '.plain', 'w')
for r in records:
    w.write(r)
w.close()
iw = recordio.MXIndexedRecordIO(idx, rec, 'w')
tells = []
for k, r in enumerate(records):
    iw.write_idx(k * 10, r)
    tells.append(iw.tell())
iw.write_idx(1000, recordio.pack(recordio.IRHeader(0, 3.5, 7, 0), b'payload'))
iw.write_idx(1001, recordio.pack(recordio.IRHeader(0, np.array([1.0, 2.0, 3.0], dtype='float32'), 8, 0), magic * 3))
iw.close()
with open(sys.argv[-1], 'wb') as f:
    pickle.dump({'tells': tells}, f)
"""

READ = r"""
import sys, pickle
import numpy as np
import mxnet as mx
from mxnet import recordio
rec, idx = sys.argv[1], sys.argv[2]
out = {}
r = recordio.MXRecordIO(rec + '.plain', 'r')
seq = []
while True:
    item = r.read()
    if item is None:
        break
    seq.append(item)
out['sequential'] = seq
r.reset()
out['after reset'] = r.read()
r.close()
ir = recordio.MXIndexedRecordIO(idx, rec, 'r')
out['keys'] = list(ir.keys)
out['backwards'] = [ir.read_idx(k) for k in reversed(ir.keys[:9])]
h, s = recordio.unpack(ir.read_idx(1000))
out['scalar header'] = (h.flag, float(h.label), h.id, h.id2, s)
h, s = recordio.unpack(ir.read_idx(1001))
out['vector header'] = (h.flag, np.asarray(h.label).tolist(), h.id, h.id2, s)
ir.close()
with open(sys.argv[-1], 'wb') as f:
    pickle.dump(out, f)
"""


def test_files_are_equal_and_each_library_reads_the_others(tmp_path):
    paths = {w: (str(tmp_path / f"{w}.rec"), str(tmp_path / f"{w}.idx")) for w in ("ours", "stock")}
    wrote = {w: run_script(WRITE, w, tmp_path, *paths[w]) for w in ("ours", "stock")}
    assert wrote["ours"] == wrote["stock"]
    for suffix in (".plain", ""):
        with open(paths["ours"][0] + suffix, "rb") as a, open(paths["stock"][0] + suffix, "rb") as b:
            assert a.read() == b.read(), f"the .rec{suffix} files differ"
    with open(paths["ours"][1]) as a, open(paths["stock"][1]) as b:
        assert a.read() == b.read(), "the .idx files differ"
    # Each reads the file the other wrote.
    ours = run_script(READ, "ours", tmp_path, *paths["stock"])
    stock = run_script(READ, "stock", tmp_path, *paths["ours"])
    assert_same_results(ours, stock)
    assert len(ours["sequential"]) == 9 and ours["sequential"][5] == b"1234" + MAGIC + MAGIC + b"tail!"
    assert ours["scalar header"] == (0, 3.5, 7, 0, b"payload")


def write_records(path, records):
    from mxnet import recordio

    w = recordio.MXRecordIO(path, "w")
    for r in records:
        w.write(r)
    w.close()


def test_damaged_files_give_clear_errors(tmp_path):
    import mxnet as mx
    from mxnet import recordio

    path = str(tmp_path / "x.rec")
    write_records(path, [b"first", b"second record"])
    data = open(path, "rb").read()

    def read_all(p):
        r = recordio.MXRecordIO(p, "r")
        try:
            return [r.read() for _ in range(3)]
        finally:
            r.close()

    assert read_all(path) == [b"first", b"second record", None]
    open(path + ".cut", "wb").write(data[:-5])
    with pytest.raises(mx.base.MXNetError, match=r"invalid RecordIO file .*x.rec.cut at byte 16: the file ends inside a record of 13 bytes"):
        read_all(path + ".cut")
    open(path + ".magic", "wb").write(b"\0\0\0\0" + data[4:])
    with pytest.raises(mx.base.MXNetError, match="at byte 0: no RecordIO magic number"):
        read_all(path + ".magic")
    with pytest.raises(mx.base.MXNetError, match="cannot open .*missing.rec"):
        recordio.MXRecordIO(str(tmp_path / "missing.rec"), "r")
    # An index that points past the end of the file.
    with open(path + ".idx", "w") as f:
        f.write(f"0\t0\n1\t{len(data) + 100}\n")
    ir = recordio.MXIndexedRecordIO(path + ".idx", path, "r")
    assert ir.read_idx(0) == b"first"
    with pytest.raises(ValueError, match=f"cannot seek to byte {len(data) + 100} of .*which has {len(data)} bytes"):
        ir.read_idx(1)
    ir.close()
    with pytest.raises(NotImplementedError, match="RecordIO files on hdfs://"):
        recordio.MXRecordIO("hdfs://host/x.rec", "r")


FORK = r"""
import os, sys
from mxnet import recordio
r = recordio.MXRecordIO(sys.argv[1], 'r')
assert r.read() == b'first'
w = recordio.MXRecordIO(sys.argv[1] + '.out', 'w')
w.write(b'buffered in the parent')
pid = os.fork()
if pid == 0:
    # The frontend forbids reading an inherited reader; reset() reopens it, from the top.
    # Closing the inherited writer must not write the parent's buffered record again.
    r.reset()
    ok = r.read() == b'first' and r.read() == b'second record'
    w.close()
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
assert os.WEXITSTATUS(status) == 0, status
assert r.read() == b'second record'  # the parent's position is its own
w.write(b'and one more')
w.close()
back = recordio.MXRecordIO(sys.argv[1] + '.out', 'r')
assert [back.read(), back.read(), back.read()] == [b'buffered in the parent', b'and one more', None]
print('ok')
"""


def test_a_forked_child_reopens_a_reader_and_drops_a_writers_buffer(tmp_path):
    path = str(tmp_path / "f.rec")
    write_records(path, [b"first", b"second record"])
    r = subprocess.run([sys.executable, "-c", FORK, path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr[-3000:]

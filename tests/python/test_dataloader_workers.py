"""DataLoader worker processes and shared-memory arrays through the stock 1.9.1 frontend, on
this library against stock's (issue 36).

One script runs on each library and records what it sees; both must see the same: batches of
an NDArray dataset with 0, 2 and 4 workers, of a NumPy dataset, with `pin_memory`, with
`thread_pool=True`, a worker whose dataset raises, and an NDArray sent from the parent to a
child process (the pickling the DataLoader registers, the other way round). Then checks of
this library alone: no descriptor or `/dev/shm` entry is left after many batches, memory a
killed process sent stays readable, `MXNET_MP_WORKER_NTHREADS` sets a forked child's engine
workers (and kernels run on one thread there), `MXNET_MP_OPENCV_NUM_THREADS` its image
threads, and the handle functions refuse bad input.
"""
import ctypes
import os
import subprocess
import sys

import pytest

from differential import assert_same_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: this would compare stock with itself")

SCRIPT = r"""
import multiprocessing as mp, pickle, sys
import mxnet as mx, numpy as np
from mxnet import gluon
from mxnet.gluon.data import dataloader  # registers the NDArray reducer with ForkingPickler

rs = np.random.RandomState(0)
X = rs.uniform(-1, 1, (37, 3, 5)).astype('float32')
Y = np.arange(37, dtype='int32')
out = {}

def batches(loader):
    return [tuple((b.asnumpy(), str(b.context), str(b.dtype)) for b in batch) for batch in loader]

nd_set = gluon.data.ArrayDataset(mx.nd.array(X), mx.nd.array(Y, dtype='int32'))
for workers in (0, 2, 4):
    out[f'ndarray {workers} workers'] = batches(gluon.data.DataLoader(nd_set, batch_size=8, num_workers=workers))
np_set = gluon.data.ArrayDataset(X, Y)
out['numpy 2 workers'] = batches(gluon.data.DataLoader(np_set, batch_size=8, num_workers=2, last_batch='discard'))
out['pin_memory'] = batches(gluon.data.DataLoader(nd_set, batch_size=16, num_workers=2, pin_memory=True))
out['thread_pool'] = batches(gluon.data.DataLoader(nd_set, batch_size=16, num_workers=2, thread_pool=True))
out['shuffled labels'] = sorted(int(v) for b in gluon.data.DataLoader(nd_set, batch_size=5, shuffle=True, num_workers=2) for v in b[1].asnumpy())

class Faulty(gluon.data.Dataset):
    def __len__(self):
        return 10
    def __getitem__(self, i):
        if i == 6:
            raise ValueError('sample 6 is broken')
        return mx.nd.full((2,), i)
try:
    batches(gluon.data.DataLoader(Faulty(), batch_size=2, num_workers=2))
    out['worker raises'] = 'no error'
except Exception as e:
    out['worker raises'] = (type(e).__name__, 'sample 6 is broken' in str(e))

# Parent -> child: the child receives an NDArray through a queue and sends back what it read,
# then an array it made (child -> parent outside a DataLoader).
def child(q_in, q_out):
    a = q_in.get()
    q_out.put((a.shape, str(a.context), a.asnumpy().tolist()))
    q_out.put(mx.nd.arange(6, ctx=mx.Context('cpu_shared', 0)).reshape((2, 3)) * 2)
    q_in.get()  # the parent has it: the descriptor is passed while this process lives
if __name__ == '__main__':
    q_in, q_out = mp.Queue(), mp.Queue()
    p = mp.Process(target=child, args=(q_in, q_out))
    p.start()
    q_in.put(mx.nd.array(X[:2, 0]))
    out['parent to child'] = q_out.get(timeout=60)
    b = q_out.get(timeout=60)
    out['child to parent'] = (b.asnumpy(), str(b.context))
    q_in.put('done')
    p.join(60)
    out['child exit'] = p.exitcode

with open(sys.argv[-1], 'wb') as f:
    pickle.dump(out, f)
"""


def test_dataloader_workers_match_stock(tmp_path):
    ours = run_script(SCRIPT, "ours", tmp_path)
    stock = run_script(SCRIPT, "stock", tmp_path)
    assert_same_results(ours, stock)
    # Not vacuous: the loaders gave every sample, and batches came from shared memory.
    assert len(ours['ndarray 2 workers']) == 5 and ours['ndarray 2 workers'][0][0][1] == 'cpu_shared(0)'
    assert ours['pin_memory'][0][0][1] == 'cpu_pinned(0)'
    assert ours['worker raises'] == ('ValueError', True)
    assert ours['child exit'] == 0


LEAKS = r"""
import os, signal, multiprocessing as mp
import mxnet as mx, numpy as np
from mxnet import gluon
from mxnet.gluon.data import dataloader

def fds():
    return len(os.listdir('/proc/self/fd'))
shm_before = sorted(os.listdir('/dev/shm'))
ds = gluon.data.ArrayDataset(mx.nd.ones((64, 4, 4)), mx.nd.arange(64))
loader = gluon.data.DataLoader(ds, batch_size=4, num_workers=2)
for b in loader:  # the pool and its sockets exist from here on
    pass
import gc
gc.collect()
before = fds()
total = 0.0
for epoch in range(10):
    for data, label in loader:
        total += label.sum().asscalar()
del data, label, b
gc.collect()
after = fds()
assert total == 10 * sum(range(64)), total
# A leak would keep one descriptor per batch (160); a few may still be in flight.
assert after <= before + 8, f'descriptors: {before} before, {after} after 10 epochs of 16 batches'

# A process that sent an array and was killed: the array stays readable here.
def sender(q):
    q.put(mx.nd.full((1000,), 3.0, ctx=mx.Context('cpu_shared', 0)))
    signal.pause()
q = mp.Queue()
p = mp.Process(target=sender, args=(q,))
p.start()
a = q.get(timeout=60)
os.kill(p.pid, signal.SIGKILL)
p.join(60)
assert p.exitcode == -signal.SIGKILL
assert a.sum().asscalar() == 3000.0
del a, loader
assert sorted(os.listdir('/dev/shm')) == shm_before, 'a /dev/shm entry was left'
print('ok')
"""

# The names of this process's threads (pasted into the scripts below).
NAMES = r"""
import os
def names():
    out = []
    for t in os.listdir('/proc/self/task'):
        with open(f'/proc/self/task/{t}/comm') as f:
            out.append(f.read().strip())
    return out
"""

THREADS = NAMES + r"""
import mxnet as mx
x = mx.nd.ones((512, 512))
(x * 2).wait_to_read()
pid = os.fork()
if pid == 0:
    y = mx.nd.dot(x, x).exp()  # big enough to split if kernels had several threads
    y.wait_to_read()
    n = names()
    workers = sum(s.startswith('cpu worker') for s in n)
    kernels = sum(s.startswith('mxnet-rt kernel') for s in n)
    print(workers, kernels, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_no_descriptor_or_shm_is_left():
    r = subprocess.run([sys.executable, "-c", LEAKS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-3000:]


@pytest.mark.parametrize("setting, expect", [(None, 1), ("3", 3)])
def test_mp_worker_nthreads_sets_a_forked_childs_engine_workers(setting, expect):
    env = dict(os.environ, MXNET_CPU_WORKER_NTHREADS="2", MXNET_ENGINE_TYPE="ThreadedEnginePerDevice")
    env.pop("MXNET_MP_WORKER_NTHREADS", None)
    if setting is not None:
        env["MXNET_MP_WORKER_NTHREADS"] = setting
    r = subprocess.run([sys.executable, "-c", THREADS], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    workers, kernels = map(int, r.stdout.split())
    assert (workers, kernels) == (expect, 0), r.stdout


IMAGE_THREADS = NAMES + r"""
import mxnet as mx, numpy as np
img = mx.nd.array(np.random.RandomState(0).randint(0, 256, (1024, 1024, 3)), dtype='uint8')
def resized():
    return [mx.image.imresize(img, 700, 500, interp=i).asnumpy() for i in (1, 2)]
parent = resized()
pid = os.fork()
if pid == 0:
    child = resized()
    same = all((a == b).all() for a, b in zip(parent, child))
    n = names()
    print(sum(s.startswith('mxnet-rt image') for s in n), sum(s.startswith('mxnet-rt kernel') for s in n), same,
          flush=True)
    os._exit(0)
os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("setting, expect", [(None, 0), ("1", 0), ("3", 3)])
def test_mp_opencv_num_threads_sets_a_forked_childs_image_threads(setting, expect):
    # Resizing (stock: OpenCV) in the forked child runs on MXNET_MP_OPENCV_NUM_THREADS
    # threads of its own (0 and 1: on the calling thread, no kernel threads either), with the
    # parent's results.
    env = dict(os.environ)
    env.pop("MXNET_MP_OPENCV_NUM_THREADS", None)
    env.pop("OMP_NUM_THREADS", None)
    if setting is not None:
        env["MXNET_MP_OPENCV_NUM_THREADS"] = setting
    r = subprocess.run([sys.executable, "-c", IMAGE_THREADS], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    image, kernel, same = r.stdout.split()
    assert (int(image), int(kernel), same) == (expect, 0, "True"), r.stdout


def test_shared_mem_handles_refuse_bad_input():
    import mxnet as mx
    from mxnet.base import _LIB, NDArrayHandle, check_call

    pid, fd = ctypes.c_int(), ctypes.c_int()
    plain = mx.nd.ones((2, 3))
    with pytest.raises(ValueError, match="only arrays on cpu_shared have a shared memory handle"):
        check_call(_LIB.MXNDArrayGetSharedMemHandle(plain.handle, ctypes.byref(pid), ctypes.byref(fd)))
    shared = mx.nd.arange(12, ctx=mx.Context('cpu_shared', 0)).reshape((3, 4))
    rows = shared[1:]
    with pytest.raises(ValueError, match="is a view at byte 16"):
        check_call(_LIB.MXNDArrayGetSharedMemHandle(rows.handle, ctypes.byref(pid), ctypes.byref(fd)))
    check_call(_LIB.MXNDArrayGetSharedMemHandle(shared.handle, ctypes.byref(pid), ctypes.byref(fd)))
    assert pid.value == os.getpid() and fd.value >= 0

    def create(pid_, fd_, shape, dtype=0):
        h = NDArrayHandle()
        dims = (ctypes.c_int * len(shape))(*shape)
        check_call(_LIB.MXNDArrayCreateFromSharedMemEx(pid_, fd_, dims, len(shape), dtype, ctypes.byref(h)))
        return mx.nd.NDArray(h)

    # Too large a shape for the memory, a closed descriptor, a negative size: refused, and the
    # descriptor given stays the caller's (still open).
    dup = os.dup(fd.value)
    with pytest.raises(ValueError, match="holds 48 bytes; the array needs 52"):
        create(pid.value, dup, (13,))
    os.fstat(dup)
    with pytest.raises(ValueError, match="not an open file descriptor"):
        create(pid.value, 100000, (1,))
    with pytest.raises(ValueError, match="negative size"):
        create(pid.value, dup, (-1, 2))
    os.fstat(dup)
    # The duplicate maps the same memory: a write through one shows through the other.
    view = create(pid.value, dup, (12,))
    assert view.context == mx.Context('cpu_shared', 0)
    view[:] = 5
    assert shared.asnumpy().sum() == 60

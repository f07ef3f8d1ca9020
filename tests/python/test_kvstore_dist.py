"""Distributed KVStore (`dist_sync`, `dist_device_sync`; issue 37) through the stock 1.9.1
frontend. Ours runs its workers under `mpirun -np 2` (MPI allreduce, no servers); stock runs
the same script as two workers of its parameter-server flow (a scheduler and a server on
loopback), in the same test. Both must give the same values on every rank, and ours the
same values on both ranks; Gluon training must also match one process that trains on both
ranks' batches."""
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from differential import assert_close_results, assert_same_results

MPIRUN = shutil.which("mpirun")

pytestmark = [
    pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                       reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare"),
    pytest.mark.skipif(MPIRUN is None, reason="mpirun not found: Open MPI is not installed "
                                              "(scripts/test.sh installs openmpi-bin)"),
]

# Open MPI refuses root without these; CI containers run as root.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def run_ours(script, tmp_path, *args, ranks=2, timeout=240):
    """`script` on `ranks` MPI ranks of ours; returns each rank's pickled results, by rank."""
    env = dict(os.environ, **MPI_ENV)
    prefix = str(tmp_path / "ours")
    r = subprocess.run([MPIRUN, "-np", str(ranks), "--bind-to", "none", sys.executable, "-c", script, prefix, *args],
                       env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"ours: {r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return [pickle.load(open(f"{prefix}.{k}.pkl", "rb")) for k in range(ranks)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_stock(script, tmp_path, *args, workers=2, timeout=240):
    """`script` as `workers` workers of stock's parameter-server flow (one scheduler, one
    server, on loopback); returns each worker's pickled results, by rank. Retried once when
    stock's processes hang."""
    for attempt in range(2):
        env = {k: v for k, v in os.environ.items() if k != "MXNET_LIBRARY_PATH"}
        env.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()), DMLC_NUM_SERVER="1",
                   DMLC_NUM_WORKER=str(workers))
        prefix = str(tmp_path / f"stock{attempt}")
        procs = [subprocess.Popen([sys.executable, "-c", script, prefix, *args], env=dict(env, DMLC_ROLE=role),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for role in ["scheduler", "server"] + ["worker"] * workers]
        deadline = time.monotonic() + timeout
        try:
            outs = [p.communicate(timeout=max(1, deadline - time.monotonic())) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
                p.communicate()
            continue
        for p, (_, err) in zip(procs[2:], outs[2:]):
            assert p.returncode == 0, f"stock: {err[-3000:]}"
        return [pickle.load(open(f"{prefix}.{k}.pkl", "rb")) for k in range(workers)]
    pytest.fail("stock's parameter-server processes hung twice")


COMMON = r"""
import pickle, sys
import numpy as np
import mxnet as mx

prefix = sys.argv[1]

def save(kv, res):
    with open("%s.%d.pkl" % (prefix, kv.rank), "wb") as f:
        pickle.dump(res, f)

def push_ranks_and_pull(kv, shape):
    # Every rank pushes (its rank + 1) to key 3; returns the pulled sum (3 on two ranks).
    kv.push(3, mx.nd.ones(shape) * (kv.rank + 1))
    out = mx.nd.zeros(shape)
    kv.pull(3, out=out)
    return out.asnumpy()
"""

STORE = COMMON + r"""
kind = sys.argv[2]
kv = mx.kv.create("dist_device_sync" if kind == "device" else "dist_sync")
r = kv.rank
rng = np.random.RandomState(100 + r)   # every rank pushes its own values
res = {"type": kv.type, "workers": kv.num_workers}

def arr(shape, dtype="float32", ctx=None, scale=1.0):
    return mx.nd.array(rng.uniform(-1, 1, shape) * scale, dtype=dtype, ctx=ctx or mx.cpu())

if kind == "compress":
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
if kind in ("plain", "device", "compress"):
    # Init: rank 0's values win.
    dt9 = "float32" if kind == "compress" else "float64"   # compression is for float32
    kv.init([3, 5, 9], [arr((4, 5)), arr((7,)), arr((2, 3), dt9)])
    o3, o5 = mx.nd.zeros((4, 5)), mx.nd.zeros((7,))
    kv.pull([3, 5], out=[o3, o5])
    res["init"] = (o3.asnumpy(), o5.asnumpy())
    # Pushes of lists over two contexts: summed on the rank, then over the ranks.
    for step in range(3):
        kv.push(3, [arr((4, 5), ctx=mx.cpu(k), scale=3.0) for k in range(2)])
        outs = [mx.nd.zeros((4, 5), ctx=mx.cpu(k)) for k in range(2)]
        kv.pull(3, out=outs)
        res["push%d" % step] = [o.asnumpy() for o in outs]
    # Several keys in one call, with a repeat.
    kv.push([9, 5, 9], [arr((2, 3), dt9), arr((7,)), arr((2, 3), dt9)])
    o9 = mx.nd.zeros((2, 3), dtype=dt9)
    kv.pull([5, 9], out=[o5, o9])
    res["multi"] = (o5.asnumpy(), o9.asnumpy())
    g = [arr((7,)) for _ in range(2)]
    if kind == "compress":   # both refuse pushpull with compression
        try:
            kv.pushpull(5, g)
            res["pushpull"] = None
        except mx.base.MXNetError as e:
            res["pushpull"] = "refused"
    else:
        kv.pushpull(5, g)
        res["pushpull"] = [x.asnumpy() for x in g]
    kv._barrier()
    if kind != "compress":
        bo = [mx.nd.zeros((2, 2), ctx=mx.cpu(k)) for k in range(2)]
        kv.broadcast(11, arr((2, 2)), out=bo)
        res["broadcast"] = [x.asnumpy() for x in bo]
    # The optimizer runs where the sums are: stock's server, every rank here.
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01))
    for step in range(3):
        kv.push(3, [arr((4, 5), ctx=mx.cpu(k)) for k in range(2)])
        kv.pull(3, out=o3)
        res["sgd%d" % step] = o3.asnumpy()
    try:
        kv.save_optimizer_states("/nonexistent/states")
        res["save_states"] = None
    except Exception as e:   # stock: the updater is on the servers
        res["save_states"] = type(e).__name__
elif kind == "strkeys":
    kv.init(["w", "b"], [arr((3, 4)), arr((4,), "float16")])
    kv.push(["b", "w"], [arr((4,), "float16"), arr((3, 4))])
    ow, ob = mx.nd.zeros((3, 4)), mx.nd.zeros((4,), dtype="float16")
    kv.pull(["w", "b"], out=[ow, ob])
    res["str"] = (ow.asnumpy(), ob.asnumpy())
    kv.set_optimizer(mx.optimizer.Adam(learning_rate=0.01))
    for step in range(2):
        kv.push("w", arr((3, 4)))
        kv.pull("w", out=ow)
        res["adam%d" % step] = ow.asnumpy()
kv._barrier()
save(kv, res)
"""


@pytest.mark.parametrize("kind", ["plain", "device", "compress", "strkeys"])
def test_store_matches_stock_and_ranks_agree(kind, tmp_path):
    ours = run_ours(STORE, tmp_path, kind)
    stock = run_stock(STORE, tmp_path, kind)
    assert ours[0]["workers"] == 2 and ours[0]["type"] == stock[0]["type"]
    assert_same_results(ours[0], ours[1])
    for r in range(2):
        # Stock's server rounds float64 sums through float32 (measured: 6e-8 off the exact
        # sum, which ours gives); every float32 value is bit-identical.
        assert_same_results(ours[r], stock[r], skip=["multi"])
        if "multi" in ours[r]:
            np.testing.assert_array_equal(ours[r]["multi"][0], stock[r]["multi"][0])
            np.testing.assert_allclose(ours[r]["multi"][1], stock[r]["multi"][1], rtol=1e-7, atol=1e-7)
    if kind == "plain":
        assert ours[0]["save_states"] == "AssertionError"


TRAIN = COMMON + r"""
from mxnet import autograd, gluon
from mxnet.gluon import nn

kvtype, update_on_kvstore, nctx, single = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "single"
update_on_kvstore = None if update_on_kvstore == "default" else update_on_kvstore == "True"
ranks, bs, steps = 2, 4, 20
if single:   # one process with every rank's contexts and batches
    kv = mx.kv.create("device")
    shards = list(range(ranks * nctx))
else:
    kv = mx.kv.create(kvtype)
    shards = [kv.rank * nctx + k for k in range(nctx)]
ctxs = [mx.cpu(k) for k in range(len(shards))]
net = nn.HybridSequential()
net.add(nn.Dense(16, activation="relu", in_units=8), nn.Dense(3, in_units=16))
net.initialize(ctx=ctxs)
# Initial weights from NumPy (the libraries' random streams differ), the same on every rank:
# the first step's gradients are computed before the trainer broadcasts rank 0's weights.
init = np.random.RandomState(3)
for p in net.collect_params().values():
    p.set_data(mx.nd.array(init.uniform(-0.5, 0.5, p.shape)))
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9},
                        kvstore=kv, update_on_kvstore=update_on_kvstore)
data = np.random.RandomState(7).randn(steps, ranks * nctx, bs, 8).astype("float32")
label = np.random.RandomState(8).randint(0, 3, (steps, ranks * nctx, bs)).astype("float32")
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
for step in range(steps):
    with autograd.record():
        losses = [loss_fn(net(mx.nd.array(data[step, s], ctx=c)), mx.nd.array(label[step, s], ctx=c))
                  for s, c in zip(shards, ctxs)]
    for l in losses:
        l.backward()
    trainer.step(bs)
res = {k: v.data(ctxs[0]).asnumpy() for k, v in net.collect_params().items()}
res["update_on_kvstore"] = trainer._update_on_kvstore
if single:
    with open(prefix + ".0.pkl", "wb") as f:
        pickle.dump(res, f)
else:
    save(kv, res)
"""


@pytest.mark.parametrize("kvtype,update_on_kvstore,nctx", [
    ("dist_sync", "default", 1),
    ("dist_sync", "False", 1),
    ("dist_device_sync", "default", 2),
])
def test_gluon_training_matches_stock_and_one_process(kvtype, update_on_kvstore, nctx, tmp_path):
    ours = run_ours(TRAIN, tmp_path, kvtype, update_on_kvstore, str(nctx), "dist")
    assert_same_results(ours[0], ours[1])   # identical weights on both ranks
    tol = lambda dtype: (1e-4, 1e-5)
    if update_on_kvstore != "False":
        # Stock with update_on_kvstore=False (pushpull of the gradients, local updates) is not
        # deterministic: the same run gave other weights each time (seen in 2 of 3 runs, off
        # by up to 2.2), so only the one-process reference below checks that mode.
        stock = run_stock(TRAIN, tmp_path, kvtype, update_on_kvstore, str(nctx), "dist")
        assert ours[0]["update_on_kvstore"] == stock[0]["update_on_kvstore"]
        for r in range(2):
            assert_close_results(ours[r], stock[r], tol)
    env = dict(os.environ)
    one = tmp_path / "one"
    r = subprocess.run([sys.executable, "-c", TRAIN, str(one), kvtype, update_on_kvstore, str(nctx), "single"],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    single = pickle.load(open(f"{one}.0.pkl", "rb"))
    single["update_on_kvstore"] = ours[0]["update_on_kvstore"]
    assert_close_results(ours[0], single, tol)


DISAGREE = COMMON + r"""
kv = mx.kv.create("dist_sync")
r = kv.rank
kv.init([3, 5], [mx.nd.ones((4,)), mx.nd.ones((4,))])
res = {}
# The ranks push different keys: both calls fail, on every rank, and nothing mixes.
kv.push(3 if r == 0 else 5, mx.nd.ones((4,)) * 7)
try:
    mx.nd.waitall()
    res["disagree"] = None
except mx.base.MXNetError as e:
    res["disagree"] = str(e).splitlines()[0]
# An agreed push afterwards works.
res["after"] = push_ranks_and_pull(kv, (4,))
save(kv, res)
"""


def test_ranks_that_disagree_fail_cleanly_and_recover(tmp_path):
    ours = run_ours(DISAGREE, tmp_path)
    for r in range(2):
        assert ours[r]["disagree"] is not None and "disagree" in ours[r]["disagree"], ours[r]
        np.testing.assert_array_equal(ours[r]["after"], np.full(4, 3.0, np.float32))


RAISES = COMMON + r"""
kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.ones((4,)))
if kv.rank == 1:
    raise RuntimeError("rank 1 fails")
for _ in range(5):
    kv.push(3, mx.nd.ones((4,)))
    kv.pull(3, out=mx.nd.zeros((4,)))
mx.nd.waitall()
"""


def test_a_rank_that_raises_ends_the_job_instead_of_hanging(tmp_path):
    env = dict(os.environ, **MPI_ENV)
    t0 = time.monotonic()
    r = subprocess.run([MPIRUN, "-np", "2", "--bind-to", "none", sys.executable, "-c", RAISES, str(tmp_path / "x")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "rank 1 fails" in r.stderr
    assert time.monotonic() - t0 < 120


@pytest.mark.parametrize("role", ["server", "scheduler"])
def test_server_and_scheduler_processes_return_at_import(role):
    """MXNet's launcher starts servers and a scheduler too: their `import mxnet` runs the
    frontend's server loop, which has nothing to serve here, and exits 0."""
    env = dict(os.environ, DMLC_ROLE=role)
    r = subprocess.run([sys.executable, "-c", "import mxnet; print('worker code ran')"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "worker code ran" not in r.stdout


BAD = COMMON + r"""
res = {}
def first_line(f):
    try:
        f()
        return None
    except Exception as e:
        return str(e).splitlines()[0]
res["async"] = first_line(lambda: mx.kv.create("dist_async"))
kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.ones((2, 2)))
res["shape"] = first_line(lambda: kv.push(3, mx.nd.ones((3,))))
res["uninit"] = first_line(lambda: kv.pull(4, out=mx.nd.zeros((2, 2))))
res["dup"] = first_line(lambda: kv.init(3, mx.nd.ones((2, 2))))
res["bool"] = first_line(lambda: kv.init(6, mx.nd.ones((2,), dtype="bool")))
# Nothing was lost: the store still works, on every rank.
res["after"] = push_ranks_and_pull(kv, (2, 2))
# A value of another dtype is summed in the key's (float16 into float32 here).
kv.push(3, mx.nd.ones((2, 2), dtype="float16") * (kv.rank + 1))
out = mx.nd.zeros((2, 2))
kv.pull(3, out=out)
res["float16"] = out.asnumpy()
save(kv, res)
"""


def test_bad_input_is_refused_and_loses_nothing(tmp_path):
    ours = run_ours(BAD, tmp_path)
    for r in range(2):
        res = ours[r]
        assert res["async"].startswith("NotImplementedError: ") and "dist_sync" in res["async"], res["async"]
        for k in ("shape", "uninit", "dup"):
            assert res[k] is not None and res[k].startswith("MXNetError: "), (k, res[k])
        assert res["bool"] is not None, res["bool"]
        np.testing.assert_array_equal(res["after"], np.full((2, 2), 3.0, np.float32))
        np.testing.assert_array_equal(res["float16"], np.full((2, 2), 3.0, np.float32))


def test_one_process_without_mpirun_is_rank_0_of_1(tmp_path):
    """A worker started without mpirun is an MPI singleton: one worker, and the store works."""
    script = COMMON + r"""
kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.ones((2,)))
kv.push(3, mx.nd.ones((2,)) * 5)
out = mx.nd.zeros((2,))
kv.pull(3, out=out)
kv._barrier()
save(kv, {"rank": kv.rank, "workers": kv.num_workers, "out": out.asnumpy()})
"""
    env = dict(os.environ, **MPI_ENV)
    prefix = tmp_path / "single"
    r = subprocess.run([sys.executable, "-c", script, str(prefix)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    res = pickle.load(open(f"{prefix}.0.pkl", "rb"))
    assert (res["rank"], res["workers"]) == (0, 1)
    np.testing.assert_array_equal(res["out"], np.full(2, 5.0, np.float32))


def test_workers_the_launcher_counted_must_all_be_in_the_mpi_world():
    """Workers started without mpirun (MXNet's launcher with its local or ssh launchers) would
    each train alone: refused when DMLC_NUM_WORKER says there are more."""
    env = dict(os.environ, DMLC_NUM_WORKER="2", **MPI_ENV)
    code = ("import mxnet as mx\n"
            "try:\n    mx.kv.create('dist_sync')\nexcept mx.base.MXNetError as e:\n    print(str(e).splitlines()[0])\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("MXNetError: DMLC_NUM_WORKER is 2 but MPI started 1 worker(s)"), r.stdout


SKIPS = COMMON + r"""
kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.ones((4,)))
res = {}
if kv.rank == 1:   # a call only rank 1 makes (refused there): the ranks' programs diverge
    try:
        kv.push(3, mx.nd.ones((5,)))
    except mx.base.MXNetError:
        pass
kv.push(3, mx.nd.ones((4,)))
try:
    mx.nd.waitall()
    res["next"] = None
except mx.base.MXNetError as e:
    res["next"] = str(e).splitlines()[0]
save(kv, res)
"""


def test_a_call_one_rank_skips_is_caught_not_paired_with_another(tmp_path):
    """Same key, same shape, but rank 1 made one call more: the push is refused on both ranks
    instead of summing values from different steps."""
    ours = run_ours(SKIPS, tmp_path)
    for r in range(2):
        assert ours[r]["next"] is not None and "disagree" in ours[r]["next"], ours[r]

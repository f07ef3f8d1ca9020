"""The control-flow operators (`mx.sym.contrib.foreach`, `while_loop`, `cond`, and Gluon
blocks that call them hybridized) on this library against stock 1.9.1 in the same test.

One script runs on both libraries: symbols with loops (states, free variables, several
sequences, a 1-D sequence, nested loops) bound and run forward and backward, a while loop with
its stacked outputs (only the rows of the steps that ran are compared: stock leaves the
padding rows unwritten, this library writes zeros), a condition taking each branch, the JSON
text of every symbol, and a hybridized Gluon block unrolling a GRU cell with
`F.contrib.foreach`. Outputs, gradients and JSON must agree.
"""
import os

import numpy as np
import pytest

from differential import assert_close_results, run_script

pytestmark = pytest.mark.skipif("MXNET_LIBRARY_PATH" not in os.environ,
                                reason="MXNET_LIBRARY_PATH is not set: no library of ours to compare")

SCRIPT = r"""
import pickle, sys
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

res = {}
rs = np.random.RandomState(7)
def arr(*shape):
    return mx.nd.array(rs.uniform(-1, 1, shape))

def run(name, sym, args, train=True):
    res[name, "json"] = sym.tojson()
    grads = {k: mx.nd.zeros(v.shape) for k, v in args.items()} if train else None
    e = sym.bind(mx.cpu(), args, args_grad=grads)
    outs = e.forward(is_train=train)
    for i, o in enumerate(outs):
        res[name, "out", i] = o.asnumpy()
    if train:
        e.backward([mx.nd.array(np.random.RandomState(i).uniform(-1, 1, o.shape)) for i, o in enumerate(outs)])
        for k, g in grads.items():
            res[name, "grad", k] = g.asnumpy()

# foreach: two sequences, two states, a free variable used inside the body.
x1, x2, s1, s2, w = (mx.sym.var(n) for n in ["x1", "x2", "s1", "s2", "w"])
def body(xs, states):
    a = xs[0] * 2 + states[0] * w
    b = mx.sym.broadcast_add(states[1], xs[1]) + a
    return [a, b * 3], [a, mx.sym.tanh(b)]
outs, states = mx.sym.contrib.foreach(body, [x1, x2], [s1, s2])
run("foreach", mx.sym.Group(outs + states),
    {"x1": arr(5, 3), "x2": arr(5, 3), "s1": arr(3), "s2": arr(3), "w": arr(3)})
# Operators after the loop that could overwrite its outputs (or its free input) in place: the
# steps' gradients still read them.
post = mx.sym.Group([mx.sym.relu(outs[0] * 2 + 1), mx.sym.tanh(states[1]) + states[0], mx.sym.sigmoid(w) * 3])
run("foreach-then-more", post, {"x1": arr(4, 3), "x2": arr(4, 3), "s1": arr(3), "s2": arr(3), "w": arr(3)})
run("foreach-infer", mx.sym.Group(outs + states),
    {"x1": arr(4, 3), "x2": arr(4, 3), "s1": arr(3), "s2": arr(3), "w": arr(3)}, train=False)

# A 1-D sequence: each step is (1,).
v = mx.sym.var("v"); acc = mx.sym.var("acc")
o, st = mx.sym.contrib.foreach(lambda d, s: ([d * s[0]], [s[0] + d]), v, [acc])
run("foreach-1d", mx.sym.Group(o + st), {"v": arr(6), "acc": arr(1)})

# Nested loops: the body of the outer loop runs an inner loop over its row.
m = mx.sym.var("m"); h = mx.sym.var("h")
def outer(row, states):
    io, ist = mx.sym.contrib.foreach(lambda e, s: (e * s[0], [s[0] + e]), row, [states[0]])
    return io, ist
o, st = mx.sym.contrib.foreach(outer, m, [h])
run("foreach-nested", mx.sym.Group([o] + st), {"m": arr(3, 4, 2), "h": arr(2)})

# while_loop: sum i*s while i <= 5, at most 8 steps; and a loop whose condition never holds.
i, s = mx.sym.var("i"), mx.sym.var("s")
for name, start, limit in [("while", 1.0, 5), ("while-none", 9.0, 5)]:
    lo, lv = mx.sym.contrib.while_loop(lambda i, s: i <= limit,
                                       lambda i, s: ([mx.sym.broadcast_mul(i, s), s * 2],
                                                    [i + 1, s + mx.sym.broadcast_mul(i, s)]),
                                       (i, s), max_iterations=8)
    steps = int(max(0, limit - start + 1))
    sym = mx.sym.Group([lo[0], lo[1]] + lv)
    res[name, "json"] = sym.tojson()
    args = {"i": mx.nd.array([start]), "s": arr(2)}
    grads = {k: mx.nd.zeros(a.shape) for k, a in args.items()}
    e = sym.bind(mx.cpu(), args, args_grad=grads)
    outs = e.forward(is_train=True)
    res[name, "vars"] = outs[2].asnumpy(), outs[3].asnumpy()
    if steps:  # stock's stacked outputs of a loop that ran no step have no shape
        res[name, "steps"] = outs[0][:steps].asnumpy(), outs[1][:steps].asnumpy()
        res[name, "shapes"] = [o.shape for o in outs]
        e.backward([mx.nd.ones(o.shape) for o in outs])
        res[name, "grad_s"] = grads["s"].asnumpy()
    elif "--ours" in sys.argv:
        res[name, "shapes"] = [o.shape for o in outs]
        res[name, "padding"] = outs[0].asnumpy()

# cond: each branch, forward and backward.
a, b = mx.sym.var("a"), mx.sym.var("b")
c = mx.sym.contrib.cond(mx.sym.sum(a * b) < 0, lambda: (a + 5) * (b + 5), lambda: [mx.sym.sin(a) * b])
for name, av in [("cond-then", -np.ones(3)), ("cond-else", np.ones(3))]:
    run(name, c, {"a": mx.nd.array(av * 0.5), "b": mx.nd.array([0.3, 0.2, 0.1])})

# A JSON round trip keeps the graphs.
res["reloaded"] = mx.sym.load_json(c.tojson()).tojson()

# Gluon: a hybridized block unrolling a GRU cell with F.contrib.foreach.
class Unroll(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.cell = gluon.rnn.GRUCell(6, input_size=4)
    def hybrid_forward(self, F, x, h):
        out, states = F.contrib.foreach(lambda d, s: self.cell(d, s), x, [h])
        return out, states[0]
net = Unroll(prefix="unroll_")
net.initialize(mx.init.Xavier(rnd_type="gaussian"), ctx=mx.cpu())
for k, p in sorted(net.collect_params().items()):
    p.set_data(mx.nd.array(np.random.RandomState(len(k)).uniform(-0.5, 0.5, p.shape)))
net.hybridize()
x, h0 = arr(7, 2, 4), arr(2, 6)
x.attach_grad()
with autograd.record():
    out, last = net(x, h0)
    loss = (out * out).sum() + last.sum()
loss.backward()
res["gluon", "out"] = out.asnumpy()
res["gluon", "last"] = last.asnumpy()
res["gluon", "dx"] = x.grad.asnumpy()
for k, p in sorted(net.collect_params().items()):
    res["gluon", k] = p.grad().asnumpy()

with open(sys.argv[-1], "wb") as f:
    pickle.dump(res, f)
"""


def test_control_flow_matches_stock(tmp_path):
    ours, stock = run_script(SCRIPT, "ours", tmp_path), run_script(SCRIPT, "stock", tmp_path)
    assert ours.keys() == stock.keys()
    assert ours["while", "shapes"] == [(8, 2), (8, 2), (1,), (2,)]
    assert ours["while", "steps"][0].shape == (5, 2)
    assert ours["while-none", "vars"][0].tolist() == [9.0]
    assert_close_results(ours, stock, lambda dtype: (1e-4, 1e-5))


def test_a_while_loop_that_runs_no_step(tmp_path):
    # Stock gives its stacked outputs no shape (reading one fails); here they are
    # max_iterations rows of zeros, the shape graph inference gives them.
    ours = run_script(SCRIPT, "ours", tmp_path, "--ours")
    assert ours["while-none", "shapes"] == [(8, 2), (8, 2), (1,), (2,)]
    assert not ours["while-none", "padding"].any()

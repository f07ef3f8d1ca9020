"""Custom operators (mx.operator.CustomOp / CustomOpProp) through the stock frontend,
imperatively: forward against NumPy, several inputs/outputs, auxiliary states, re-entrant
NDArray calls inside callbacks, kwargs, errors, the backward operator, all engine types and
many calls in a row (no hangs, no leaked operator objects)."""
import faulthandler
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mxnet as mx

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def hang_guard():
    # A deadlock must fail the run, not stall it.
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# The operators are defined in a module-level string too, so that the engine subprocesses
# use exactly the same ones.
OPS = r'''
import numpy as np
import mxnet as mx


class Sigmoid(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        x = in_data[0].asnumpy()
        self.assign(out_data[0], req[0], mx.nd.array(1.0 / (1.0 + np.exp(-x)), dtype=x.dtype))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        y = out_data[0].asnumpy()
        self.assign(in_grad[0], req[0], mx.nd.array(out_grad[0].asnumpy() * y * (1 - y)))


@mx.operator.register("t_sigmoid")
class SigmoidProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)

    def list_arguments(self):
        return ['data']

    def list_outputs(self):
        return ['output']

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return Sigmoid()


class AddSub(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        a, b = in_data
        self.assign(out_data[0], req[0], a + b)
        self.assign(out_data[1], req[1], a - b)


@mx.operator.register("t_addsub")
class AddSubProp(mx.operator.CustomOpProp):
    def list_arguments(self):
        return ['a', 'b']

    def list_outputs(self):
        return ['sum', 'diff']

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0], in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return AddSub()


class Counter(mx.operator.CustomOp):
    """out = x + count, then count += 1 (an auxiliary state the operator updates)."""
    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0] + aux[0])
        aux[0][:] = aux[0] + 1


@mx.operator.register("t_counter")
class CounterProp(mx.operator.CustomOpProp):
    def list_arguments(self):
        return ['data']

    def list_auxiliary_states(self):
        return ['count']

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], [in_shape[0]]

    def create_operator(self, ctx, shapes, dtypes):
        return Counter()


class Busy(mx.operator.CustomOp):
    """Allocates and computes with mx.nd inside forward, and waits on the results."""
    def __init__(self, ctx):
        self.ctx = ctx

    def forward(self, is_train, req, in_data, out_data, aux):
        x = in_data[0]
        z = mx.nd.zeros(x.shape, ctx=self.ctx)
        z = z + x
        z = mx.nd._internal._plus_scalar(z, scalar=1.0)
        z.wait_to_read()
        w = mx.nd.ones_like(x) * 2
        assert float(w.sum().asscalar()) == 2 * x.size
        out_data[0][:] = z * w
        # The output can be read back inside forward (it has no pending work of the op).
        assert np.allclose(out_data[0].asnumpy(), (x.asnumpy() + 1) * 2)


@mx.operator.register("t_busy")
class BusyProp(mx.operator.CustomOpProp):
    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return Busy(ctx)


class Affine(mx.operator.CustomOp):
    def __init__(self, factor, bias):
        self.factor, self.bias = factor, bias

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0] * self.factor + self.bias)


@mx.operator.register("t_affine")
class AffineProp(mx.operator.CustomOpProp):
    seen = []

    def __init__(self, factor, bias='0', out_dtype='float32'):
        super().__init__()
        AffineProp.seen.append((factor, bias, out_dtype))
        self.factor, self.bias, self.out_dtype = float(factor), float(bias), out_dtype

    def infer_type(self, in_type):
        return in_type, [np.dtype(self.out_dtype).type], []

    def create_operator(self, ctx, shapes, dtypes):
        return Affine(self.factor, self.bias)


class Faulty(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        raise ValueError("faulty forward says no")


@mx.operator.register("t_faulty")
class FaultyProp(mx.operator.CustomOpProp):
    def __init__(self, where='forward'):
        super().__init__()
        if where == 'init':
            raise RuntimeError("faulty prop init")
        self.where = where

    def infer_shape(self, in_shape):
        if self.where == 'infer_shape':
            raise RuntimeError("faulty infer_shape")
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        if self.where == 'create':
            raise RuntimeError("faulty create_operator")
        return Faulty()


class Nested(mx.operator.CustomOp):
    """Runs another custom operator inside forward and waits for its result."""
    def forward(self, is_train, req, in_data, out_data, aux):
        y = mx.nd.Custom(in_data[0], op_type='t_sigmoid')
        self.assign(out_data[0], req[0], y * 2)
        y.wait_to_read()


@mx.operator.register("t_nested")
class NestedProp(mx.operator.CustomOpProp):
    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return Nested()


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def live_objects():
    """Prop and operator objects the frontend still holds for the library."""
    return len(mx.operator._registry.ref_holder)
'''

exec(compile(OPS, "custom_ops", "exec"))


def test_sigmoid_forward_matches_numpy():
    x = np.random.uniform(-4, 4, (3, 5)).astype(np.float32)
    y = mx.nd.Custom(mx.nd.array(x), op_type='t_sigmoid')
    assert y.shape == (3, 5) and y.dtype == np.float32
    np.testing.assert_allclose(y.asnumpy(), sigmoid(x), rtol=1e-6)
    # float64 in, float64 out (the default infer_type follows the input).
    y64 = mx.nd.Custom(mx.nd.array(x, dtype='float64'), op_type='t_sigmoid')
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64.asnumpy(), sigmoid(x.astype(np.float64)), rtol=1e-12)


def test_two_inputs_two_outputs_and_out_arg():
    a = np.random.rand(4, 3).astype(np.float32)
    b = np.random.rand(4, 3).astype(np.float32)
    s, d = mx.nd.Custom(mx.nd.array(a), mx.nd.array(b), op_type='t_addsub')
    np.testing.assert_allclose(s.asnumpy(), a + b, rtol=1e-6)
    np.testing.assert_allclose(d.asnumpy(), a - b, rtol=1e-6)
    # Caller-given outputs, one of them an input (written in place).
    na, nb = mx.nd.array(a), mx.nd.array(b)
    out_s = mx.nd.zeros((4, 3))
    mx.nd.Custom(na, nb, op_type='t_addsub', out=[out_s, na])
    np.testing.assert_allclose(out_s.asnumpy(), a + b, rtol=1e-6)
    np.testing.assert_allclose(na.asnumpy(), a - b, rtol=1e-6)
    with pytest.raises(mx.base.MXNetError, match="takes 2 inputs"):
        mx.nd.Custom(mx.nd.array(a), op_type='t_addsub')


def test_auxiliary_states_are_updated():
    x = mx.nd.array(np.arange(6, dtype=np.float32).reshape(2, 3))
    count = mx.nd.zeros((2, 3))
    for i in range(3):
        y = mx.nd.Custom(x, count, op_type='t_counter')
        np.testing.assert_allclose(y.asnumpy(), x.asnumpy() + i)
    np.testing.assert_allclose(count.asnumpy(), np.full((2, 3), 3.0))


def test_reentrant_ndarray_calls_inside_forward():
    x = np.random.rand(5, 2).astype(np.float32)
    for _ in range(5):
        y = mx.nd.Custom(mx.nd.array(x), op_type='t_busy')
        np.testing.assert_allclose(y.asnumpy(), (x + 1) * 2, rtol=1e-6)


def test_custom_op_inside_custom_op():
    x = np.random.rand(3).astype(np.float32)
    y = mx.nd.Custom(mx.nd.array(x), op_type='t_nested')
    np.testing.assert_allclose(y.asnumpy(), 2 * sigmoid(x), rtol=1e-6)


def test_kwargs_reach_the_prop():
    x = np.array([1.0, 2.0, -3.0], dtype=np.float32)
    AffineProp.seen.clear()
    y = mx.nd.Custom(mx.nd.array(x), op_type='t_affine', factor=2.5, bias=-1)
    np.testing.assert_allclose(y.asnumpy(), x * 2.5 - 1)
    assert AffineProp.seen[0] == ('2.5', '-1', 'float32')
    y = mx.nd.Custom(mx.nd.array(x), op_type='t_affine', factor='3', out_dtype='float64')
    assert y.dtype == np.float64
    np.testing.assert_allclose(y.asnumpy(), x * 3.0)
    # A missing required kwarg is the prop's TypeError, reported as an MXNetError.
    with pytest.raises(mx.base.MXNetError, match="t_affine"):
        mx.nd.Custom(mx.nd.array(x), op_type='t_affine')


def test_backward_operator():
    x = np.random.uniform(-2, 2, (2, 4)).astype(np.float32)
    dy = np.random.rand(2, 4).astype(np.float32)
    nx = mx.nd.array(x)
    y = mx.nd.Custom(nx, op_type='t_sigmoid')
    # _backward_Custom takes the declared dependencies (out_grad, in_data, out_data).
    dx = mx.nd._internal._backward_Custom(mx.nd.array(dy), nx, y, op_type='t_sigmoid')
    s = sigmoid(x)
    np.testing.assert_allclose(dx.asnumpy(), dy * s * (1 - s), rtol=1e-5)
    gx = mx.nd.zeros((2, 4))
    mx.nd._internal._backward_Custom(mx.nd.array(dy), nx, y, op_type='t_sigmoid', out=gx)
    np.testing.assert_allclose(gx.asnumpy(), dy * s * (1 - s), rtol=1e-5)
    with pytest.raises(mx.base.MXNetError, match="takes 3 inputs"):
        mx.nd._internal._backward_Custom(mx.nd.array(dy), op_type='t_sigmoid')


def test_errors_then_engine_still_works(capsys):
    x = mx.nd.array([1.0, 2.0])
    with pytest.raises(mx.base.MXNetError, match="t_not_registered"):
        mx.nd.Custom(x, op_type='t_not_registered')
    for where, text in [('init', 'CustomOpProp'), ('infer_shape', 'infer_shape'), ('create', 'create_operator')]:
        with pytest.raises(mx.base.MXNetError, match=text):
            mx.nd.Custom(x, op_type='t_faulty', where=where)
    # An exception inside forward fails the outputs (reported when they are read), once.
    y = mx.nd.Custom(x, op_type='t_faulty')
    with pytest.raises(mx.base.MXNetError, match="t_faulty.*CustomOp.forward"):
        y.asnumpy()
    assert "faulty forward says no" in capsys.readouterr().out
    # Dependents of a failed output fail too; the engine itself stays usable.
    y = mx.nd.Custom(x, op_type='t_faulty')
    z = y + 1
    with pytest.raises(mx.base.MXNetError):
        z.asnumpy()
    mx.nd.waitall()
    np.testing.assert_allclose(mx.nd.Custom(x, op_type='t_sigmoid').asnumpy(), sigmoid(np.array([1.0, 2.0])), rtol=1e-6)
    np.testing.assert_allclose((x * 2).asnumpy(), [2.0, 4.0])


def test_many_calls_do_not_leak_or_hang():
    base = live_objects()
    x = np.random.rand(8).astype(np.float32)
    nx = mx.nd.array(x)
    outs = [mx.nd.Custom(nx, op_type='t_sigmoid') for _ in range(300)]
    mx.nd.waitall()
    for o in outs[::37]:
        np.testing.assert_allclose(o.asnumpy(), sigmoid(x), rtol=1e-6)
    del outs
    chained = nx
    for _ in range(100):
        chained = mx.nd.Custom(chained, op_type='t_busy')
    chained.wait_to_read()
    mx.nd.waitall()
    # Every prop and operator object was deleted through its delete callback.
    assert live_objects() == base


ENGINE_SCRIPT = OPS + r'''
import os, threading
x = np.random.rand(4, 3).astype(np.float32)
nx = mx.nd.array(x)
np.testing.assert_allclose(mx.nd.Custom(nx, op_type='t_sigmoid').asnumpy(), sigmoid(x), rtol=1e-6)
np.testing.assert_allclose(mx.nd.Custom(nx, op_type='t_busy').asnumpy(), (x + 1) * 2, rtol=1e-6)
np.testing.assert_allclose(mx.nd.Custom(nx, op_type='t_nested').asnumpy(), 2 * sigmoid(x), rtol=1e-6)
s, d = mx.nd.Custom(nx, nx, op_type='t_addsub')
np.testing.assert_allclose(s.asnumpy(), 2 * x, rtol=1e-6)
count = mx.nd.zeros((4, 3))
mx.nd.Custom(nx, count, op_type='t_counter').wait_to_read()
np.testing.assert_allclose(count.asnumpy(), np.ones((4, 3)))
try:
    mx.nd.Custom(nx, op_type='t_faulty').asnumpy()
    raise SystemExit("no error")
except mx.base.MXNetError as e:
    assert 't_faulty' in str(e), str(e)
base = live_objects()
outs = [mx.nd.Custom(nx, op_type='t_sigmoid') for _ in range(200)]
mx.nd.waitall()
np.testing.assert_allclose(outs[-1].asnumpy(), sigmoid(x), rtol=1e-6)
del outs
mx.nd.waitall()
assert live_objects() == base, (live_objects(), base)
threads = threading.active_count()
# Shutdown stops the custom-operator threads; later calls still work.
mx.base.check_call(mx.base._LIB.MXNotifyShutdown())
np.testing.assert_allclose(mx.nd.Custom(nx, op_type='t_busy').asnumpy(), (x + 1) * 2, rtol=1e-6)
print("OK", os.environ.get("MXNET_ENGINE_TYPE"), len(os.listdir('/proc/self/task')))
'''


@pytest.mark.parametrize("engine,max_pending", [
    ("NaiveEngine", 0), ("ThreadedEngine", 0), ("ThreadedEnginePerDevice", 0),
    # Back-pressure must not make callbacks wait for the operation that waits for them.
    ("ThreadedEnginePerDevice", 1),
])
def test_engine_types(engine, max_pending):
    env = dict(os.environ, MXNET_ENGINE_TYPE=engine, MXNET_ENGINE_MAX_PENDING_OPS=str(max_pending))
    r = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert ("OK " + engine) in r.stdout
    # The custom-operator threads stay few (they grow only when jobs block each other).
    tasks = int(r.stdout.strip().split()[-1])
    assert tasks < 64, r.stdout

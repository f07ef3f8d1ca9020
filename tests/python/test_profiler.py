"""The profiler through the stock 1.9.1 frontend (`mxnet.profiler`), following seed 004:
set_config, run, pause/resume, dump, dumps (table and JSON, sort and reset), the user's
objects, autostart; every trace parsed and checked (valid JSON, safe ids, counts that match
the aggregate statistics)."""
import json
import os
import subprocess
import sys
import threading
import time

import mxnet as mx
import numpy as np
import pytest
from mxnet import profiler

SAFE = 2 ** 53


def load_trace(path):
    with open(path) as f:
        doc = json.load(f)
    assert doc.get("displayTimeUnit") == "ms"
    events = doc["traceEvents"]
    for e in events:
        for key in ("pid", "tid"):
            if key in e:
                assert isinstance(e[key], int) and 0 <= e[key] < 1 << 16, e
        assert e["ph"] in ("X", "C", "i", "M"), e
        if e["ph"] == "X":
            assert e["dur"] >= 0 and 0 <= e["ts"] < SAFE, e
    return events


def op_counts(events):
    counts = {}
    for e in events:
        if e["ph"] == "X" and e["cat"] == "operator":
            counts[e["name"]] = counts.get(e["name"], 0) + 1
    return counts


@pytest.fixture
def trace_file(tmp_path):
    yield str(tmp_path / "profile.json")
    profiler.set_state("stop")
    profiler.set_config(continuous_dump=False, filename=str(tmp_path / "after.json"))


def test_seed_004_flow(trace_file):
    profiler.set_config(profile_all=True, aggregate_stats=True, continuous_dump=False, filename=trace_file)
    profiler.set_state("run")
    a = mx.nd.ones((64, 64))
    b = mx.nd.dot(a, a)
    c = mx.nd.sqrt(b) + 1
    c = c + 1
    mx.nd.waitall()
    profiler.set_state("stop")
    profiler.dump()
    events = load_trace(trace_file)
    counts = op_counts(events)
    for name, n in [("_ones", 1), ("dot", 1), ("sqrt", 1), ("_plus_scalar", 2)]:
        assert counts.get(name) == n, counts
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert "cpu/0" in names and "MXNET_C_API" in names, names
    assert any(e["ph"] == "M" and e["name"] == "thread_name" for e in events)
    api = [e["name"] for e in events if e["ph"] == "X" and e["cat"] == "MXNET_C_API"]
    assert "MXImperativeInvokeEx" in api and "MXNDArrayWaitAll" in api
    assert any(e["ph"] == "C" and e["cat"] == "Device Storage" for e in events), "memory counters"

    stats = json.loads(profiler.dumps(format="json"))
    assert set(stats) == {"Time", "Memory", "Unit"}
    assert stats["Unit"] == {"Time": "ms", "Memory": "kB"}
    ops = stats["Time"]["operator"]
    assert ops["sqrt"]["Count"] == 1 and ops["_plus_scalar"]["Count"] == 2
    for name, n in counts.items():
        assert ops[name]["Count"] == n, (name, ops[name], n)
    for entry in ops.values():
        assert set(entry) == {"Count", "Total", "Min", "Max", "Avg"}
        assert entry["Min"] <= entry["Avg"] <= entry["Max"] <= entry["Total"] + 1e-9
    mem = stats["Memory"]["Device Storage"]["Memory: cpu/0"]
    assert set(mem) == {"Count", "Min", "Max", "Avg"} and mem["Max"] >= 16.384  # kB: 64x64 floats

    table = profiler.dumps()
    assert table.startswith("\nProfile Statistics:\n\tNote the difference in units for different entries.\n")
    for block in ("Device Storage\n=================", "MXNET_C_API\n=================", "operator\n================="):
        assert block in table, table
    assert "Total Count" in table and "Avg Time (ms)" in table


def test_dumps_sorting_and_reset(trace_file):
    profiler.set_config(profile_all=True, aggregate_stats=True, continuous_dump=False, filename=trace_file)
    profiler.set_state("run")
    x = mx.nd.ones((8,))
    for _ in range(3):
        x = x + 1
    mx.nd.exp(x).wait_to_read()
    profiler.set_state("stop")
    for sort_by in ("total", "avg", "min", "max", "count"):
        for ascending in (False, True):
            stats = json.loads(profiler.dumps(format="json", sort_by=sort_by, ascending=ascending))
            for cat in stats["Time"].values():
                keys = [v[sort_by.capitalize()] for v in cat.values()]
                assert keys == sorted(keys, reverse=not ascending), (sort_by, ascending, keys)
    assert json.loads(profiler.dumps(format="json"))["Time"]["operator"]["_plus_scalar"]["Count"] == 3
    profiler.dumps(reset=True)
    assert "_plus_scalar" not in profiler.dumps()


def test_dumps_is_empty_without_aggregate_stats(trace_file):
    profiler.set_config(profile_all=True, continuous_dump=False, filename=trace_file)
    profiler.set_state("run")
    mx.nd.ones((2,)).wait_to_read()
    assert profiler.dumps() == ""
    assert profiler.dumps(reset=True) == ""


def test_pause_really_pauses(trace_file):
    profiler.set_config(profile_all=True, continuous_dump=False, filename=trace_file)
    profiler.set_state("run")
    mx.nd.relu(mx.nd.ones((4,))).wait_to_read()
    profiler.pause()
    mx.nd.sigmoid(mx.nd.ones((4,))).wait_to_read()
    profiler.resume()
    mx.nd.tanh(mx.nd.ones((4,))).wait_to_read()
    profiler.set_state("stop")
    profiler.dump()
    counts = op_counts(load_trace(trace_file))
    assert counts.get("relu") == 1 and counts.get("tanh") == 1, counts
    assert "sigmoid" not in counts, counts


def test_objects_appear(trace_file):
    profiler.set_config(profile_all=True, continuous_dump=False, filename=trace_file)
    profiler.set_state("run")
    d = profiler.Domain("my\"domain")
    t = profiler.Task(d, "mytask")
    t.start()
    t.stop()
    f = profiler.Frame(d, "myframe")
    f.start()
    f.stop()
    e = profiler.Event("myevent")
    e.start()
    e.stop()
    c = profiler.Counter(d, "mycounter", 5)
    c += 3
    c -= 10
    profiler.Marker(d, "mymarker").mark()
    profiler.Marker(d, "thread marker").mark("thread")
    profiler.set_state("stop")
    profiler.dump()
    events = load_trace(trace_file)
    by = {}
    for ev in events:
        by.setdefault(ev["name"], []).append(ev)
    assert by["mytask"][0]["ph"] == "X" and by["mytask"][0]["cat"] == 'my"domain'
    assert by["myframe"][0]["cat"] == 'my"domain,frame'
    assert by["myevent"][0]["cat"] == "event"
    assert [ev["args"]["mycounter"] for ev in by["mycounter"]] == [5, 8, -2]
    assert by["mymarker"][0]["ph"] == "i" and by["mymarker"][0]["s"] == "p"
    assert by["thread marker"][0]["s"] == "t"
    procs = {ev["args"]["name"] for ev in events if ev["name"] == "process_name"}
    assert 'my"domain' in procs


def test_bad_config_is_rejected():
    for kw in (dict(bogus=1), dict(profile_all="maybe"), dict(dump_period="x"), dict(dump_period=-1)):
        with pytest.raises(mx.base.MXNetError) as e:
            profiler.set_config(**kw)
        assert list(kw)[0] in str(e.value)
    with pytest.raises(mx.base.MXNetError, match="valid|one of"):
        profiler.Marker(profiler.Domain("d"), "m").mark("bogus")


def test_dump_before_run_is_an_error(tmp_path):
    profiler.set_config(filename=str(tmp_path / "never.json"), continuous_dump=False)
    with pytest.raises(mx.base.MXNetError, match="hasn't been run"):
        profiler.dump()


def test_every_dump_is_valid_under_stress(trace_file):
    profiler.set_config(profile_all=True, aggregate_stats=True, continuous_dump=False, filename=trace_file)
    profiler.set_state("run")
    stop = threading.Event()
    errors = []

    def pusher(seed):
        try:
            x = mx.nd.ones((16, 16)) * seed
            while not stop.is_set():
                x = (x + 1) * 0.5
                mx.nd.sum(x).wait_to_read()
        except Exception as ex:  # pragma: no cover - reported below
            errors.append(ex)

    threads = [threading.Thread(target=pusher, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    parsed = 0
    deadline = time.time() + 3
    try:
        while time.time() < deadline:
            profiler.dump(False)
            load_trace(trace_file)  # raises if not complete JSON
            parsed += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert parsed >= 5
    mx.nd.waitall()
    profiler.set_state("stop")
    profiler.dump()
    events = load_trace(trace_file)
    stats = json.loads(profiler.dumps(format="json"))["Time"]["operator"]
    for name, n in op_counts(events).items():
        assert stats[name]["Count"] == n, name


def test_continuous_dump_keeps_a_valid_file(trace_file):
    profiler.set_config(profile_all=True, continuous_dump=True, dump_period=0.05, filename=trace_file)
    profiler.set_state("run")
    for _ in range(20):
        mx.nd.ones((4,)).wait_to_read()
        time.sleep(0.01)
    deadline = time.time() + 5
    while not os.path.exists(trace_file) and time.time() < deadline:
        time.sleep(0.02)
    counts = op_counts(load_trace(trace_file))  # written by the dump thread, no dump() call
    assert counts.get("_ones", 0) >= 1
    assert not [p for p in os.listdir(os.path.dirname(trace_file)) if ".tmp" in p], "temporary file left"


AUTOSTART = """
import atexit, mxnet as mx, sys
x = mx.nd.ones((3, 3))
y = mx.nd.relu(x) + 2
y.wait_to_read()
if sys.argv[1] == 'no-shutdown':
    atexit.unregister(mx.base._notify_shutdown)
"""


@pytest.mark.parametrize("how", ["shutdown", "no-shutdown"])
def test_autostart_writes_a_complete_file_at_exit(tmp_path, how):
    env = dict(os.environ, MXNET_PROFILER_AUTOSTART="1", MXNET_PROFILER_MODE="1")
    r = subprocess.run([sys.executable, "-c", AUTOSTART, how], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    counts = op_counts(load_trace(tmp_path / "profile.json"))
    assert counts.get("relu") == 1 and counts.get("_plus_scalar") == 1, counts


def test_autostart_mode_0_records_no_imperative_ops(tmp_path):
    env = dict(os.environ, MXNET_PROFILER_AUTOSTART="1", MXNET_PROFILER_MODE="0")
    r = subprocess.run([sys.executable, "-c", AUTOSTART, "shutdown"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert op_counts(load_trace(tmp_path / "profile.json")) == {}


def test_results_are_unchanged_by_profiling(trace_file):
    x = np.random.RandomState(0).rand(32, 32).astype(np.float32)
    expect = (mx.nd.dot(mx.nd.array(x), mx.nd.array(x)) + 1).asnumpy()
    profiler.set_config(profile_all=True, continuous_dump=False, filename=trace_file)
    profiler.set_state("run")
    got = (mx.nd.dot(mx.nd.array(x), mx.nd.array(x)) + 1).asnumpy()
    np.testing.assert_allclose(got, expect, rtol=1e-6)


class _Sigmoid(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        z = mx.nd.zeros(in_data[0].shape)
        self.assign(out_data[0], req[0], mx.nd.sigmoid(in_data[0]) + z)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        pass


@mx.operator.register("ProfiledSigmoid")
class _SigmoidProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return _Sigmoid()


def test_custom_operator_category(trace_file):
    profiler.set_config(profile_all=True, aggregate_stats=True, continuous_dump=False, filename=trace_file)
    profiler.set_state("run")
    x = mx.nd.array([[-1.0, 0.0, 2.0]])
    y = mx.nd.Custom(x, op_type="ProfiledSigmoid")
    np.testing.assert_allclose(y.asnumpy(), 1 / (1 + np.exp(-x.asnumpy())), rtol=1e-6)
    mx.nd.waitall()
    profiler.set_state("stop")
    custom = json.loads(profiler.dumps(format="json"))["Time"]["Custom Operator"]
    assert custom["ProfiledSigmoid::pure_python"]["Count"] == 1, custom
    assert custom["ProfiledSigmoid::_zeros"]["Count"] == 1, custom
    assert custom["ProfiledSigmoid::sigmoid"]["Count"] == 1, custom

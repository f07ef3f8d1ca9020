'use strict';
// mxnet-rt for Node.js: owns loading libmxnet.so through koffi (an FFI package from npm),
// arrays whose handles are freed by dispose() (or, as a fallback, when collected), operator
// calls by stock name, waits, the profiler, and errors carrying the library's error class.
//
// The library: MXNET_LIBRARY_PATH (an absolute path), else the checkout's
// target/release/libmxnet.so.

const koffi = require('koffi');
const path = require('path');

const libPath = process.env.MXNET_LIBRARY_PATH || path.join(__dirname, '..', '..', 'target', 'release', 'libmxnet.so');
const lib = koffi.load(libPath);

const c = {
  lastError: lib.func('const char *MXGetLastError()'),
  version: lib.func('int MXGetVersion(_Out_ int *out)'),
  create: lib.func('int MXNDArrayCreateEx(const uint32_t *shape, uint32_t ndim, int dev_type, int dev_id, int delay_alloc, int dtype, _Out_ void **out)'),
  free: lib.func('int MXNDArrayFree(void *handle)'),
  copyFrom: lib.func('int MXNDArraySyncCopyFromCPU(void *handle, const float *data, size_t size)'),
  copyTo: lib.func('int MXNDArraySyncCopyToCPU(void *handle, _Out_ float *data, size_t size)'),
  shape: lib.func('int MXNDArrayGetShapeEx(void *handle, _Out_ int *out_dim, _Out_ const int **out_pdata)'),
  dtype: lib.func('int MXNDArrayGetDType(void *handle, _Out_ int *out_dtype)'),
  waitToRead: lib.func('int MXNDArrayWaitToRead(void *handle)'),
  waitAll: lib.func('int MXNDArrayWaitAll()'),
  opHandle: lib.func('int NNGetOpHandle(const char *op_name, _Out_ void **op_out)'),
  invoke: lib.func('int MXImperativeInvoke(void *creator, int num_inputs, void **inputs, _Inout_ int *num_outputs, _Inout_ void **outputs, int num_params, const char **keys, const char **vals)'),
  profilerConfig: lib.func('int MXSetProcessProfilerConfig(int num_params, const char **keys, const char **vals, void *kvstore)'),
  profilerState: lib.func('int MXSetProcessProfilerState(int state, int profile_process, void *kvstore)'),
  profilerDump: lib.func('int MXDumpProcessProfile(int finished, int profile_process, void *kvstore)'),
  profilerStats: lib.func('int MXAggregateProfileStatsPrintEx(_Out_ const char **out_str, int reset, int format, int sort_by, int ascending)'),
};

const KINDS = ['ValueError', 'TypeError', 'IndexError', 'NotImplementedError', 'AttributeError', 'InternalError', 'MXNetError'];

/** A failed library call: `kind` is the library's error class (`ValueError`, `MXNetError`, ...). */
class MXError extends Error {
  constructor(message) {
    super(message);
    const cls = message.split(':')[0].trim();
    this.kind = KINDS.includes(cls) ? cls : cls || 'MXNetError';
    this.name = 'MXError';
  }
}

function check(rc) {
  if (rc !== 0) throw new MXError(c.lastError());
}

// Arrays not disposed are freed when collected (the library's handles may be freed from any
// thread).
const collected = new FinalizationRegistry((handle) => c.free(handle));

/** A float32 array on the CPU. Free it with dispose(); a collected one is freed too. */
class NDArray {
  constructor(handle) {
    this.handle = handle;
    collected.register(this, handle, this);
  }

  /** A float32 array of `shape` holding `values` (row-major). */
  static from(shape, values) {
    const out = [null];
    check(c.create(Uint32Array.from(shape), shape.length, 1, 0, 1, 0, out));
    const a = new NDArray(out[0]);
    a.copyFrom(values);
    return a;
  }

  live() {
    if (this.handle === null) throw new MXError('ValueError: the NDArray was disposed');
    return this.handle;
  }

  copyFrom(values) {
    const v = Float32Array.from(values);
    check(c.copyFrom(this.live(), v, v.length));
  }

  get shape() {
    const ndim = [0];
    const data = [null];
    check(c.shape(this.live(), ndim, data));
    return ndim[0] > 0 ? Array.from(koffi.decode(data[0], 'int', ndim[0])) : [];
  }

  /** The values as a Float32Array, after the array's pending writes. */
  toArray() {
    const dt = [-1];
    check(c.dtype(this.live(), dt));
    if (dt[0] !== 0) throw new MXError(`TypeError: dtype code ${dt[0]} is not float32`);
    const out = new Float32Array(this.shape.reduce((a, b) => a * b, 1));
    check(c.copyTo(this.handle, out, out.length));
    return out;
  }

  waitToRead() {
    check(c.waitToRead(this.live()));
  }

  dispose() {
    if (this.handle !== null) {
      collected.unregister(this);
      check(c.free(this.handle));
      this.handle = null;
    }
  }
}

/** Call operator `op` on `inputs` with `params` ({name: value}); returns its new outputs. */
function invoke(op, inputs, params = {}) {
  const creator = [null];
  check(c.opHandle(op, creator));
  const keys = Object.keys(params);
  const vals = keys.map((k) => String(params[k]));
  const nOut = [0];
  const outs = [null];
  check(c.invoke(creator[0], inputs.length, inputs.map((a) => a.live()), nOut, outs, keys.length, keys, vals));
  return Array.from(koffi.decode(outs[0], 'void *', nOut[0])).map((h) => new NDArray(h));
}

function version() {
  const v = [0];
  check(c.version(v));
  return v[0];
}

function waitAll() {
  check(c.waitAll());
}

const profiler = {
  setConfig(options) {
    const keys = Object.keys(options);
    check(c.profilerConfig(keys.length, keys, keys.map((k) => String(options[k])), null));
  },
  setRunning(running) {
    check(c.profilerState(running ? 1 : 0, 0, null));
  },
  dump(finished = true) {
    check(c.profilerDump(finished ? 1 : 0, 0, null));
  },
  summary() {
    const s = [null];
    check(c.profilerStats(s, 0, 0, 0, 0));
    return s[0];
  },
};

module.exports = { NDArray, MXError, invoke, version, waitAll, profiler, libPath };

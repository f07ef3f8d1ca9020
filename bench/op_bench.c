/* Operator throughput through the C ABI (MXImperativeInvokeEx), for any libmxnet.so (loaded
 * from MXNET_LIBRARY_PATH). Prints one JSON line per repetition.
 *
 *   op_bench dot N REPS          dot of two N x N float32 matrices          -> GFLOP/s
 *   op_bench add N REPS          elemwise_add of N floats (out given)       -> GB/s (3 x 4N bytes)
 *   op_bench sum N REPS          sum of N floats                            -> GB/s (4N bytes)
 *   op_bench conv1 0 REPS        Convolution 64x1x28x28, 20 5x5 filters     -> GFLOP/s
 *   op_bench conv2 0 REPS        Convolution 64x20x12x12, 50 5x5 filters    -> GFLOP/s
 *   op_bench fc 0 REPS           FullyConnected 64x800 -> 512               -> GFLOP/s
 *   op_bench tiny N REPS         N calls of elemwise_add on 1-element arrays, each output
 *                                allocated by the call and freed, as the frontend does -> us/call
 *   op_bench tinyout N REPS      the same into one caller-given output (no allocation)  -> us/call
 *
 * Each timed repetition ends with MXNDArrayWaitAll, so the time covers the computation.
 */
#define _POSIX_C_SOURCE 199309L
#include <mxnet/mxnet_loader.h>

#include <stdint.h>
#include <time.h>

typedef void *NDArrayHandle;
typedef void *OpHandle;
static int (*CreateEx)(const uint32_t *, uint32_t, int, int, int, int, NDArrayHandle *);
static int (*Free)(NDArrayHandle);
static int (*CopyFromCPU)(NDArrayHandle, const void *, size_t);
static int (*WaitAll)(void);
static int (*GetOp)(const char *, OpHandle *);
static int (*Invoke)(OpHandle, int, NDArrayHandle *, int *, NDArrayHandle **, int, const char **, const char **,
                     const int **);
static const char *(*LastError)(void);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void check(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "%s failed: %s\n", what, LastError());
    exit(1);
  }
}

static NDArrayHandle array(const uint32_t *shape, uint32_t ndim) {
  NDArrayHandle h;
  size_t n = 1, i;
  float *buf;
  for (i = 0; i < ndim; i++) n *= shape[i];
  check(CreateEx(shape, ndim, 1, 0, 0, 0, &h), "create");
  buf = malloc(n * sizeof(float));
  for (i = 0; i < n; i++) buf[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  check(CopyFromCPU(h, buf, n), "copy");
  free(buf);
  return h;
}

/* Invoke `op` on `in` into the given outputs `out` (n_out of them). */
static void call(OpHandle op, int n_in, NDArrayHandle *in, int n_out, NDArrayHandle *out, int n_p, const char **k,
                 const char **v) {
  const int *st;
  NDArrayHandle *o = out;
  check(Invoke(op, n_in, in, &n_out, &o, n_p, k, v, &st), "invoke");
}

int main(int argc, char **argv) {
  mxnet_loader l;
  long n, reps, r, i;
  const char *what;
  if (argc != 4) {
    fprintf(stderr, "usage: op_bench dot|add|sum|conv1|conv2|fc|tiny N REPS\n");
    return 2;
  }
  what = argv[1];
  n = atol(argv[2]);
  reps = atol(argv[3]);
  if (mxnet_loader_open(&l, NULL) != 0) {
    fprintf(stderr, "%s\n", l.error);
    return 1;
  }
  if (mxnet_loader_sym(&l, "MXNDArrayCreateEx", (void **)&CreateEx) ||
      mxnet_loader_sym(&l, "MXNDArrayFree", (void **)&Free) ||
      mxnet_loader_sym(&l, "MXNDArraySyncCopyFromCPU", (void **)&CopyFromCPU) ||
      mxnet_loader_sym(&l, "MXNDArrayWaitAll", (void **)&WaitAll) ||
      mxnet_loader_sym(&l, "NNGetOpHandle", (void **)&GetOp) ||
      mxnet_loader_sym(&l, "MXImperativeInvokeEx", (void **)&Invoke) ||
      mxnet_loader_sym(&l, "MXGetLastError", (void **)&LastError)) {
    fprintf(stderr, "%s\n", l.error);
    return 1;
  }
  if (strcmp(what, "tiny") == 0 || strcmp(what, "tinyout") == 0) {
    int given = strcmp(what, "tinyout") == 0; /* into one preallocated output: no alloc/free */
    uint32_t s1[1] = {1};
    NDArrayHandle in[2], fixed;
    OpHandle add;
    in[0] = array(s1, 1);
    in[1] = array(s1, 1);
    fixed = array(s1, 1);
    check(GetOp("elemwise_add", &add), "op");
    for (r = 0; r < reps + 1; r++) { /* repetition 0 warms up */
      double t0 = now(), dt;
      for (i = 0; i < n; i++) {
        int n_out = given;
        NDArrayHandle *out = given ? &fixed : NULL;
        const int *st;
        check(Invoke(add, 2, in, &n_out, &out, 0, NULL, NULL, &st), "invoke");
        if (!given) check(Free(out[0]), "free");
      }
      check(WaitAll(), "waitall");
      dt = now() - t0;
      if (r > 0) printf("{\"case\": \"%s\", \"us_per_call\": %.4f}\n", what, dt / n * 1e6);
    }
    return 0;
  }
  {
    NDArrayHandle in[3], out[1];
    const char *keys[8], *vals[8];
    int n_in = 2, n_p = 0;
    double work = 0; /* flops or bytes per call */
    const char *unit = "gflops";
    OpHandle op;
    if (strcmp(what, "dot") == 0) {
      uint32_t s[2] = {(uint32_t)n, (uint32_t)n};
      in[0] = array(s, 2);
      in[1] = array(s, 2);
      out[0] = array(s, 2);
      check(GetOp("dot", &op), "op");
      work = 2.0 * n * n * n;
    } else if (strcmp(what, "add") == 0) {
      uint32_t s[1] = {(uint32_t)n};
      in[0] = array(s, 1);
      in[1] = array(s, 1);
      out[0] = array(s, 1);
      check(GetOp("elemwise_add", &op), "op");
      work = 12.0 * n;
      unit = "gbps";
    } else if (strcmp(what, "sum") == 0) {
      uint32_t s[1] = {(uint32_t)n}, s0[1] = {1};
      in[0] = array(s, 1);
      out[0] = array(s0, 1);
      n_in = 1;
      check(GetOp("sum", &op), "op");
      work = 4.0 * n;
      unit = "gbps";
    } else if (strcmp(what, "conv1") == 0 || strcmp(what, "conv2") == 0) {
      int c1 = strcmp(what, "conv1") == 0;
      uint32_t sd[4] = {64, c1 ? 1 : 20, c1 ? 28 : 12, c1 ? 28 : 12};
      uint32_t sw[4] = {c1 ? 20 : 50, c1 ? 1 : 20, 5, 5};
      uint32_t sb[1] = {c1 ? 20 : 50};
      uint32_t so[4] = {64, c1 ? 20 : 50, c1 ? 24 : 8, c1 ? 24 : 8};
      in[0] = array(sd, 4);
      in[1] = array(sw, 4);
      in[2] = array(sb, 1);
      out[0] = array(so, 4);
      n_in = 3;
      keys[0] = "kernel", vals[0] = "(5, 5)";
      keys[1] = "num_filter", vals[1] = c1 ? "20" : "50";
      n_p = 2;
      check(GetOp("Convolution", &op), "op");
      work = 2.0 * so[0] * so[1] * so[2] * so[3] * sw[1] * 25;
    } else if (strcmp(what, "fc") == 0) {
      uint32_t sd[2] = {64, 800}, sw[2] = {512, 800}, sb[1] = {512}, so[2] = {64, 512};
      in[0] = array(sd, 2);
      in[1] = array(sw, 2);
      in[2] = array(sb, 1);
      out[0] = array(so, 2);
      n_in = 3;
      keys[0] = "num_hidden", vals[0] = "512";
      n_p = 1;
      check(GetOp("FullyConnected", &op), "op");
      work = 2.0 * 64 * 800 * 512;
    } else {
      fprintf(stderr, "unknown case %s\n", what);
      return 2;
    }
    check(WaitAll(), "waitall");
    /* Two untimed repetitions first: pools, tuning, packing buffers, pages and the cores'
     * clocks settle (the first ~100 ms of a process run up to 2x slower on this machine). */
    for (r = -2; r < reps; r++) {
      /* Enough calls per repetition for ~50 ms of work at 100 units/s. */
      long calls = (long)(5e9 / work) + 1, c;
      double t0 = now(), dt;
      if (calls > 2000) calls = 2000;
      for (c = 0; c < calls; c++) call(op, n_in, in, 1, out, n_p, keys, vals);
      check(WaitAll(), "waitall");
      dt = now() - t0;
      if (r >= 0) printf("{\"case\": \"%s\", \"%s\": %.3f}\n", what, unit, work * calls / dt / 1e9);
    }
  }
  return 0;
}

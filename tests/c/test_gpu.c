/* GPUs through the public header: device count and memory, arrays on gpu(0) and copies both
 * ways, every operator with a GPU form compared with the same call on the CPU (float32 and
 * float64, broadcasting, scalars, in place, accumulation), GEMMs (dot, batch_dot,
 * FullyConnected), conversions, and the clear error of an operator without a GPU form.
 * Without a GPU it checks that gpu(0) is refused with a clear error and exits 77 (CTest's
 * skip code), saying that it skipped. With `bench` as argument it also times a few calls. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <mxnet/c_api.h>

#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int compared = 0;

enum { CPU = 1, GPU = 2, F32 = 0, F64 = 1 };

static double urand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return ((*s >> 8) & 0xFFFFFF) / (double)0x1000000;
}

static size_t count(const uint32_t *shape, int ndim) {
  size_t n = 1;
  int i;
  for (i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

/* An array of `dtype` on (dev, 0) holding `v` (doubles converted). */
static NDArrayHandle make(int dev, int dtype, const uint32_t *shape, int ndim, const double *v) {
  NDArrayHandle h = NULL;
  size_t n = count(shape, ndim), i;
  CHECK(MXNDArrayCreateEx(shape, (uint32_t)ndim, dev, 0, 0, dtype, &h) == 0);
  if (v && h) {
    if (dtype == F32) {
      float *f = malloc(n * sizeof(float));
      for (i = 0; i < n; i++) f[i] = (float)v[i];
      CHECK(MXNDArraySyncCopyFromCPU(h, f, n) == 0);
      free(f);
    } else {
      CHECK(MXNDArraySyncCopyFromCPU(h, v, n) == 0);
    }
  }
  return h;
}

/* The values of `h` as doubles (n elements). */
static double *values(NDArrayHandle h, size_t *n_out) {
  uint32_t ndim = 0;
  const uint32_t *shape = NULL;
  int dtype = -1;
  size_t n, i;
  double *out;
  CHECK(MXNDArrayGetShape(h, &ndim, &shape) == 0);
  CHECK(MXNDArrayGetDType(h, &dtype) == 0);
  n = count(shape, (int)ndim);
  out = malloc((n ? n : 1) * sizeof(double));
  if (dtype == F32) {
    float *f = malloc((n ? n : 1) * sizeof(float));
    CHECK(MXNDArraySyncCopyToCPU(h, f, n) == 0);
    for (i = 0; i < n; i++) out[i] = f[i];
    free(f);
  } else {
    CHECK(dtype == F64);
    CHECK(MXNDArraySyncCopyToCPU(h, out, n) == 0);
  }
  *n_out = n;
  return out;
}

static OpHandle op(const char *name) {
  OpHandle h = NULL;
  CHECK(NNGetOpHandle(name, &h) == 0);
  return h;
}

/* Max of |a - b| / (1 + |b|) over the arrays, NaN-aware (both NaN agree). */
static double compare(NDArrayHandle gpu, NDArrayHandle cpu) {
  size_t ng = 0, nc = 0, i;
  double *g = values(gpu, &ng), *c = values(cpu, &nc), worst = 0;
  CHECK(ng == nc);
  for (i = 0; i < ng && i < nc; i++) {
    double e;
    if (isnan(g[i]) && isnan(c[i])) continue;
    if (isinf(g[i]) && g[i] == c[i]) continue;
    e = fabs(g[i] - c[i]) / (1 + fabs(c[i]));
    if (!(e <= worst)) worst = e;
  }
  free(g);
  free(c);
  return worst;
}

/* Run `name` with `params` on the CPU inputs and on their GPU copies; compare. */
static void check_op(const char *name, int dtype, int n_in, uint32_t shapes[][4], const int *ndims,
                     int positive, int nparam, const char **keys, const char **vals) {
  NDArrayHandle cpu_in[3], gpu_in[3], *outs = NULL;
  NDArrayHandle cpu_out = NULL, gpu_out = NULL;
  int i, n_out = 0;
  unsigned seed = 1234u + (unsigned)strlen(name) * 77u;
  double tol = dtype == F32 ? 2e-5 : 1e-12, err;
  for (i = 0; i < n_in; i++) {
    size_t n = count(shapes[i], ndims[i]), j;
    double *v = malloc((n ? n : 1) * sizeof(double));
    for (j = 0; j < n; j++) v[j] = positive ? 0.1 + 2 * urand(&seed) : 4 * urand(&seed) - 2;
    cpu_in[i] = make(CPU, dtype, shapes[i], ndims[i], v);
    gpu_in[i] = make(GPU, dtype, shapes[i], ndims[i], v);
    free(v);
  }
  n_out = 0;
  outs = NULL;
  if (MXImperativeInvoke(op(name), n_in, cpu_in, &n_out, &outs, nparam, keys, vals) != 0) {
    fprintf(stderr, "%s on cpu failed: %s\n", name, MXGetLastError());
    failures++;
    return;
  }
  cpu_out = outs[0];
  n_out = 0;
  outs = NULL;
  if (MXImperativeInvoke(op(name), n_in, gpu_in, &n_out, &outs, nparam, keys, vals) != 0) {
    fprintf(stderr, "%s on gpu failed: %s\n", name, MXGetLastError());
    failures++;
    return;
  }
  gpu_out = outs[0];
  {
    int dev_type = 0, dev_id = -1;
    CHECK(MXNDArrayGetContext(gpu_out, &dev_type, &dev_id) == 0 && dev_type == GPU && dev_id == 0);
  }
  err = compare(gpu_out, cpu_out);
  compared++;
  if (!(err <= tol)) {
    fprintf(stderr, "%s (%s): gpu differs from cpu by %g (tolerance %g)\n", name, dtype == F32 ? "float32" : "float64",
            err, tol);
    failures++;
  }
  for (i = 0; i < n_in; i++) {
    MXNDArrayFree(cpu_in[i]);
    MXNDArrayFree(gpu_in[i]);
  }
  MXNDArrayFree(cpu_out);
  MXNDArrayFree(gpu_out);
}

static const char *UNARY[] = {"negative", "abs", "sign", "round", "rint", "ceil", "floor", "trunc", "square",
                              "exp", "expm1", "sin", "cos", "tan", "arctan", "sinh", "cosh", "tanh", "arcsinh",
                              "degrees", "radians", "relu", "sigmoid", "softsign", "logical_not", "_copy",
                              "Flatten", NULL};
static const char *POSITIVE[] = {"sqrt", "rsqrt", "cbrt", "rcbrt", "log", "log10", "log2", "log1p", "reciprocal",
                                 "arccosh", NULL};
static const char *BINARY[] = {"elemwise_add", "elemwise_sub", "elemwise_mul", "elemwise_div", "_mod",
                               "_power", "_maximum", "_minimum", "_hypot", "_equal", "_not_equal",
                               "_greater", "_greater_equal", "_lesser", "_lesser_equal", "_logical_and",
                               "_logical_or", "_logical_xor", NULL};
static const char *BROADCAST[] = {"broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_div",
                                  "broadcast_mod", "broadcast_maximum", "broadcast_minimum",
                                  "broadcast_power", "broadcast_greater", "broadcast_equal", NULL};
static const char *SCALAR[] = {"_plus_scalar", "_minus_scalar", "_rminus_scalar", "_mul_scalar", "_div_scalar",
                               "_rdiv_scalar", "_mod_scalar", "_rmod_scalar", "_maximum_scalar",
                               "_minimum_scalar", "_power_scalar", "_rpower_scalar", "_greater_scalar", NULL};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Mean time of `reps` calls of FullyConnected (batch x 1024 -> 1024, random data) on `dev`,
 * after 3 warm-up calls; informational (speed is measured in bench/, never asserted). */
static void bench_fc(int dev, int batch, int reps) {
  uint32_t xs[2] = {(uint32_t)batch, 1024}, ws[2] = {1024, 1024}, bs[1] = {1024};
  NDArrayHandle in[3], *outs = NULL;
  const char *k[1] = {"num_hidden"}, *v[1] = {"1024"};
  int n_out = 0, r;
  size_t j, n = (size_t)batch * 1024 > 1024 * 1024 ? (size_t)batch * 1024 : 1024 * 1024;
  unsigned seed = 7;
  double t0 = 0, *vals = malloc(n * sizeof(double));
  for (j = 0; j < n; j++) vals[j] = urand(&seed) - 0.5;
  in[0] = make(dev, F32, xs, 2, vals);
  in[1] = make(dev, F32, ws, 2, vals);
  in[2] = make(dev, F32, bs, 1, vals);
  free(vals);
  for (r = -3; r < reps; r++) {
    if (r == 0) {
      CHECK(MXNDArrayWaitAll() == 0);
      t0 = now();
    }
    n_out = 0;
    outs = NULL;
    CHECK(MXImperativeInvoke(op("FullyConnected"), 3, in, &n_out, &outs, 1, k, v) == 0);
    MXNDArrayFree(outs[0]);
  }
  CHECK(MXNDArrayWaitAll() == 0);
  printf("bench: FullyConnected %dx1024x1024 float32 on %s: %.3f ms per call (%d calls)\n", batch,
         dev == GPU ? "gpu(0)" : "cpu(0)", (now() - t0) * 1e3 / reps, reps);
  for (r = 0; r < 3; r++) MXNDArrayFree(in[r]);
}

int main(int argc, char **argv) {
  int n_gpu = -1, i, dt;
  uint64_t free_mem = 0, total_mem = 0;
  uint32_t s1[1][4] = {{257}}, s2[2][4] = {{3, 70}, {3, 70}};
  int nd1[1] = {1}, nd2[2] = {2, 2};
  const char *sk[1] = {"scalar"}, *sv[1] = {"1.75"};
  CHECK(MXGetGPUCount(&n_gpu) == 0);
  if (n_gpu <= 0) {
    NDArrayHandle h = NULL;
    uint32_t shape[1] = {4};
    CHECK(n_gpu == 0);
    CHECK(MXNDArrayCreateEx(shape, 1, GPU, 0, 0, 0, &h) == -1);
    CHECK(strstr(MXGetLastError(), "gpu(0) is not available") != NULL);
    CHECK(MXGetGPUMemoryInformation64(0, &free_mem, &total_mem) == -1);
    if (failures) return 1;
    printf("gpu: SKIPPED (no CUDA driver or GPU on this machine); the refusals were checked\n");
    return 77;
  }
  CHECK(MXGetGPUMemoryInformation64(0, &free_mem, &total_mem) == 0);
  CHECK(free_mem > 0 && free_mem <= total_mem);
  printf("gpu: %d GPU(s); gpu(0): %.1f of %.1f GiB free\n", n_gpu, free_mem / 1073741824.0,
         total_mem / 1073741824.0);
  {
    const struct LibFeature *lf = NULL;
    size_t nf = 0, j;
    CHECK(MXLibInfoFeatures(&lf, &nf) == 0);
    for (j = 0; j < nf; j++)
      if (strcmp(lf[j].name, "CUDA") == 0 || strcmp(lf[j].name, "CUDA_RTC") == 0) {
        printf("gpu: feature %s = %d\n", lf[j].name, (int)lf[j].enabled);
        CHECK(lf[j].enabled);
      }
  }

  for (dt = 0; dt < 2; dt++) {
    for (i = 0; UNARY[i]; i++) check_op(UNARY[i], dt, 1, s1, nd1, 0, 0, NULL, NULL);
    for (i = 0; POSITIVE[i]; i++) check_op(POSITIVE[i], dt, 1, s1, nd1, 1, 0, NULL, NULL);
    for (i = 0; BINARY[i]; i++) check_op(BINARY[i], dt, 2, s2, nd2, strcmp(BINARY[i], "_power") == 0, 0, NULL, NULL);
    for (i = 0; SCALAR[i]; i++) {
      int pos = strstr(SCALAR[i], "power") != NULL;
      check_op(SCALAR[i], dt, 1, s1, nd1, pos, 1, sk, sv);
    }
    {
      /* Broadcasting: (4,1,5) with (3,1); (2,3,4) with (4); (1) with (6). */
      uint32_t b1[2][4] = {{4, 1, 5}, {3, 1}}, b2[2][4] = {{2, 3, 4}, {4}}, b3[2][4] = {{1}, {6}};
      int n1[2] = {3, 2}, n2[2] = {3, 1}, n3[2] = {1, 1};
      for (i = 0; BROADCAST[i]; i++) {
        int pos = strstr(BROADCAST[i], "power") != NULL;
        check_op(BROADCAST[i], dt, 2, b1, n1, pos, 0, NULL, NULL);
        check_op(BROADCAST[i], dt, 2, b2, n2, pos, 0, NULL, NULL);
        check_op(BROADCAST[i], dt, 2, b3, n3, pos, 0, NULL, NULL);
      }
    }
    {
      /* GEMMs, with transposes; FullyConnected with and without bias and flatten. */
      uint32_t d1[2][4] = {{64, 128}, {128, 32}}, d2[2][4] = {{128, 64}, {32, 128}};
      uint32_t d3[2][4] = {{2, 3, 8}, {8, 5}}, d4[2][4] = {{7}, {7}};
      uint32_t bd[2][4] = {{6, 16, 24}, {6, 24, 8}}, bdt[2][4] = {{6, 24, 16}, {6, 8, 24}};
      uint32_t fc[3][4] = {{16, 3, 4, 5}, {10, 60}, {10}}, fcn[3][4] = {{4, 6, 60}, {10, 60}, {10}};
      int n22[2] = {2, 2}, n32[2] = {3, 2}, n11[2] = {1, 1}, n33[2] = {3, 3}, nfc[3] = {4, 2, 1}, nfcn[3] = {3, 2, 1};
      const char *tk[2] = {"transpose_a", "transpose_b"}, *tv[2] = {"true", "true"};
      const char *fk[3] = {"num_hidden", "no_bias", "flatten"}, *fv[3] = {"10", "false", "true"};
      const char *fv2[3] = {"10", "true", "true"}, *fv3[3] = {"10", "false", "false"};
      check_op("dot", dt, 2, d1, n22, 0, 0, NULL, NULL);
      check_op("dot", dt, 2, d2, n22, 0, 2, tk, tv);
      check_op("dot", dt, 2, d3, n32, 0, 0, NULL, NULL);
      check_op("dot", dt, 2, d4, n11, 0, 0, NULL, NULL);
      check_op("batch_dot", dt, 2, bd, n33, 0, 0, NULL, NULL);
      check_op("batch_dot", dt, 2, bdt, n33, 0, 2, tk, tv);
      check_op("FullyConnected", dt, 3, fc, nfc, 0, 3, fk, fv);
      check_op("FullyConnected", dt, 2, fc, nfc, 0, 3, fk, fv2);
      check_op("FullyConnected", dt, 3, fcn, nfcn, 0, 3, fk, fv3);
    }
  }
  {
    /* Conversions, shape operators and fills. */
    const char *ck[1] = {"dtype"}, *cv[1] = {"float64"}, *rk[1] = {"shape"}, *rv[1] = {"(10, -1)"};
    uint32_t s[1][4] = {{10, 7}};
    int nd[1] = {2};
    const char *zk[3] = {"shape", "ctx", "dtype"}, *zv[3] = {"(5, 9)", "gpu(0)", "float32"};
    const char *fk[4] = {"shape", "ctx", "dtype", "value"}, *fv[4] = {"(3, 3)", "gpu(0)", "float64", "2.5"};
    NDArrayHandle *outs = NULL;
    int n_out = 0;
    size_t n = 0, j;
    double *v;
    check_op("Cast", F32, 1, s, nd, 0, 1, ck, cv);
    check_op("Reshape", F32, 1, s, nd, 0, 1, rk, rv);
    check_op("expand_dims", F64, 1, s, nd, 0, 1, (const char *[]){"axis"}, (const char *[]){"1"});
    CHECK(MXImperativeInvoke(op("_ones"), 0, NULL, &n_out, &outs, 3, zk, zv) == 0);
    v = values(outs[0], &n);
    CHECK(n == 45);
    for (j = 0; j < n; j++) CHECK(v[j] == 1.0);
    free(v);
    n_out = 0;
    outs = NULL;
    CHECK(MXImperativeInvoke(op("_full"), 0, NULL, &n_out, &outs, 4, fk, fv) == 0);
    v = values(outs[0], &n);
    CHECK(n == 9);
    for (j = 0; j < n; j++) CHECK(v[j] == 2.5);
    free(v);
  }
  {
    /* In place and accumulation: a += b on the GPU; copies GPU->GPU and GPU->CPU. */
    uint32_t shape[1] = {1000};
    double a[1000], b[1000];
    NDArrayHandle ga, gb, gc, cc, ins[2], outs_given[1], *outs;
    int n_out = 1;
    size_t n = 0, j;
    double *v;
    for (j = 0; j < 1000; j++) {
      a[j] = j * 0.5;
      b[j] = 1000.0 - j;
    }
    ga = make(GPU, F64, shape, 1, a);
    gb = make(GPU, F64, shape, 1, b);
    ins[0] = ga;
    ins[1] = gb;
    outs_given[0] = ga;
    outs = outs_given;
    CHECK(MXImperativeInvoke(op("elemwise_add"), 2, ins, &n_out, &outs, 0, NULL, NULL) == 0);
    v = values(ga, &n);
    for (j = 0; j < n; j++) CHECK(v[j] == a[j] + b[j]);
    free(v);
    gc = make(GPU, F64, shape, 1, NULL);
    cc = make(CPU, F64, shape, 1, NULL);
    CHECK(MXNDArraySyncCopyFromNDArray(gc, ga, -1) == 0);
    ins[0] = gc;
    outs_given[0] = cc;
    outs = outs_given;
    n_out = 1;
    CHECK(MXImperativeInvoke(op("_copyto"), 1, ins, &n_out, &outs, 0, NULL, NULL) == 0);
    v = values(cc, &n);
    for (j = 0; j < n; j++) CHECK(v[j] == a[j] + b[j]);
    free(v);
    /* Mixed contexts are refused; an operator without a GPU form says so. */
    ins[0] = cc;
    ins[1] = gb;
    outs = NULL;
    n_out = 0;
    CHECK(MXImperativeInvoke(op("elemwise_add"), 2, ins, &n_out, &outs, 0, NULL, NULL) == -1);
    ins[0] = gb;
    CHECK(MXImperativeInvoke(op("argmax"), 1, ins, &n_out, &outs, 0, NULL, NULL) == -1);
    CHECK(strncmp(MXGetLastError(), "NotImplementedError: operator argmax on gpu(0)", 46) == 0);
    MXNDArrayFree(ga);
    MXNDArrayFree(gb);
    MXNDArrayFree(gc);
    MXNDArrayFree(cc);
  }
  CHECK(MXNDArrayWaitAll() == 0);
  CHECK(MXStorageEmptyCache(GPU, 0) == 0);
  if (argc > 1 && strcmp(argv[1], "bench") == 0) {
    bench_fc(GPU, 256, 200);
    bench_fc(CPU, 256, 20);
  }
  if (failures) {
    fprintf(stderr, "gpu: %d check(s) failed\n", failures);
    return 1;
  }
  printf("gpu: all checks passed (%d operator calls compared with the CPU)\n", compared);
  return 0;
}

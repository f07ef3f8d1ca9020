/* The Predict API through the stock header name <mxnet/c_predict_api.h>: MXPredCreate with
 * parameters from a file's bytes, outputs against values computed here, output shape and
 * type, MXPredReshape, MXPredPartialForward, MXPredCreatePartialOut, MXPredCreateMultiThread
 * on four threads at once, the monitor callback, NDArray lists, and bad input (each failure
 * with its error type, nothing written). The graph: relu(FullyConnected(data, num_hidden=3)). */
#define _POSIX_C_SOURCE 200809L
#include <mxnet/c_predict_api.h>

#include "check.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *JSON =
    "{\"nodes\": ["
    "{\"op\": \"null\", \"name\": \"data\", \"inputs\": []},"
    "{\"op\": \"null\", \"name\": \"fc_weight\", \"inputs\": []},"
    "{\"op\": \"null\", \"name\": \"fc_bias\", \"inputs\": []},"
    "{\"op\": \"FullyConnected\", \"name\": \"fc\", \"attrs\": {\"num_hidden\": \"3\"},"
    " \"inputs\": [[0, 0, 0], [1, 0, 0], [2, 0, 0]]},"
    "{\"op\": \"Activation\", \"name\": \"relu\", \"attrs\": {\"act_type\": \"relu\"},"
    " \"inputs\": [[3, 0, 0]]}],"
    "\"arg_nodes\": [0, 1, 2], \"node_row_ptr\": [0, 1, 2, 3, 4, 5], \"heads\": [[4, 0, 0]],"
    "\"attrs\": {\"mxnet_version\": [\"int\", 10901]}}";

static const float W[12] = {0.5f, -1, 0.25f, 2, -0.5f, 1, 1, -1, 1, 0.5f, -2, 0.75f};
static const float B[3] = {0.1f, -0.2f, 0.3f};

static char params[4096];
static int params_size = 0;

/* The parameter file's bytes, saved with the library's own writer. */
static void make_params(void) {
  NDArrayHandle a[2];
  uint32_t ws[2] = {3, 4}, bs[1] = {3};
  const char *names[2] = {"arg:fc_weight", "arg:fc_bias"};
  char path[] = "/tmp/mxnet_rt_predict_XXXXXX";
  int fd = mkstemp(path);
  FILE *f;
  CHECK(fd >= 0);
  close(fd);
  CHECK(MXNDArrayCreate(ws, 2, 1, 0, 0, &a[0]) == 0);
  CHECK(MXNDArrayCreate(bs, 1, 1, 0, 0, &a[1]) == 0);
  CHECK(MXNDArraySyncCopyFromCPU(a[0], W, 12) == 0);
  CHECK(MXNDArraySyncCopyFromCPU(a[1], B, 3) == 0);
  CHECK(MXNDArraySave(path, 2, a, names) == 0);
  f = fopen(path, "rb");
  CHECK(f != NULL);
  if (f) {
    params_size = (int)fread(params, 1, sizeof params, f);
    fclose(f);
  }
  remove(path);
  MXNDArrayFree(a[0]);
  MXNDArrayFree(a[1]);
}

/* relu(x W^T + b), or without the relu, for `batch` rows of 4. */
static void expected(const float *x, int batch, int relu, float *out) {
  int n, o, i;
  for (n = 0; n < batch; ++n)
    for (o = 0; o < 3; ++o) {
      float s = B[o];
      for (i = 0; i < 4; ++i) s += x[n * 4 + i] * W[o * 4 + i];
      out[n * 3 + o] = relu && s < 0 ? 0 : s;
    }
}

static int same(const float *a, const float *b, int n) {
  int i;
  for (i = 0; i < n; ++i)
    if (a[i] - b[i] > 1e-5f || b[i] - a[i] > 1e-5f) return 0;
  return 1;
}

static PredictorHandle create(uint32_t batch) {
  const char *keys[1] = {"data"};
  uint32_t indptr[2] = {0, 2}, shape[2];
  PredictorHandle p = NULL;
  shape[0] = batch;
  shape[1] = 4;
  CHECK(MXPredCreate(JSON, params, params_size, 1, 0, 1, keys, indptr, shape, &p) == 0);
  return p;
}

static void input(float *x, int n, int seed) {
  int i;
  for (i = 0; i < n; ++i) x[i] = (float)((i * 7 + seed * 13) % 11) / 4.0f - 1.2f;
}

struct job {
  PredictorHandle pred;
  int seed, ok;
};

static void *run_job(void *arg) {
  struct job *j = arg;
  float x[8], y[6], want[6];
  int round;
  j->ok = 1;
  for (round = 0; round < 20; ++round) {
    input(x, 8, j->seed + round);
    expected(x, 2, 1, want);
    if (MXPredSetInput(j->pred, "data", x, 8) != 0 || MXPredForward(j->pred) != 0 ||
        MXPredGetOutput(j->pred, 0, y, 6) != 0 || !same(y, want, 6))
      j->ok = 0;
  }
  return NULL;
}

static int monitored = 0, monitored_fc = 0;

static void on_array(const char *name, NDArrayHandle arr, void *data) {
  CHECK(data == (void *)&monitored);
  monitored++;
  if (strcmp(name, "fc_output") == 0) monitored_fc++;
  CHECK(MXNDArrayFree(arr) == 0);
}

int main(void) {
  float x[16], y[12], want[12];
  uint32_t *shape = NULL, ndim = 0;
  int dtype = -1, left = -1, step, i;
  PredictorHandle p, q = NULL, parts[4] = {NULL, NULL, NULL, NULL};
  make_params();
  CHECK(params_size > 0 && params_size < (int)sizeof params);

  /* Create, run, read. */
  p = create(2);
  input(x, 8, 1);
  expected(x, 2, 1, want);
  CHECK(MXPredSetInput(p, "data", x, 8) == 0);
  CHECK(MXPredForward(p) == 0);
  CHECK(MXPredGetOutputShape(p, 0, &shape, &ndim) == 0);
  CHECK(ndim == 2 && shape[0] == 2 && shape[1] == 3);
  CHECK(MXPredGetOutputType(p, 0, &dtype) == 0 && dtype == 0);
  CHECK(MXPredGetOutput(p, 0, y, 6) == 0);
  CHECK(same(y, want, 6));

  /* Partial forward on a new input: five nodes (three variables), then the outputs are
   * ready (the new input's, not the last forward's). */
  memset(y, 0, sizeof y);
  input(x, 8, 4);
  expected(x, 2, 1, want);
  CHECK(MXPredSetInput(p, "data", x, 8) == 0);
  for (step = 0; step < 5; ++step) {
    CHECK(MXPredPartialForward(p, step, &left) == 0);
    CHECK(left == 4 - step);
  }
  CHECK(MXPredGetOutput(p, 0, y, 6) == 0 && same(y, want, 6));
  CHECK(MXPredPartialForward(p, 9, &left) == 0 && left == 0);
  left = 42;
  CHECK(MXPredPartialForward(p, 3, &left) == -1 && left == 42);
  CHECK(starts_with(MXGetLastError(), "ValueError: partial forward runs its steps in order"));

  /* Reshape: a new predictor with the same parameters; the old one still works. */
  {
    const char *keys[1] = {"data"};
    uint32_t indptr[2] = {0, 2}, s4[2] = {4, 4}, s5[2] = {4, 5};
    CHECK(MXPredReshape(1, keys, indptr, s4, p, &q) == 0);
    input(x, 16, 2);
    expected(x, 4, 1, want);
    CHECK(MXPredSetInput(q, "data", x, 16) == 0);
    CHECK(MXPredForward(q) == 0);
    CHECK(MXPredGetOutput(q, 0, y, 12) == 0 && same(y, want, 12));
    CHECK(MXPredGetOutputShape(q, 0, &shape, &ndim) == 0 && ndim == 2 && shape[0] == 4);
    /* The weight's shape would change: refused. */
    CHECK(MXPredReshape(1, keys, indptr, s5, p, &parts[0]) == -1 && parts[0] == NULL);
    CHECK(starts_with(MXGetLastError(), "ValueError: arg fc_weight shape has been changed"));
    CHECK(MXPredFree(q) == 0);
  }

  /* The monitor: each operator's output, as handles the callback frees. */
  CHECK(MXPredSetMonitorCallback(p, on_array, &monitored, false) == 0);
  CHECK(MXPredForward(p) == 0);
  CHECK(MXNDArrayWaitAll() == 0);
  CHECK(monitored == 2 && monitored_fc == 1);
  CHECK(MXPredSetMonitorCallback(p, NULL, NULL, false) == 0);
  CHECK(MXPredForward(p) == 0 && MXNDArrayWaitAll() == 0 && monitored == 2);

  /* Bad input: an error of the right type; nothing written. */
  CHECK(MXPredSetInput(p, "data", x, 5) == -1);
  CHECK(starts_with(MXGetLastError(), "ValueError: buffer of 5 elements"));
  CHECK(MXPredSetInput(p, "label", x, 8) == -1);
  CHECK(starts_with(MXGetLastError(), "ValueError: cannot find input key label"));
  CHECK(MXPredGetOutput(p, 1, y, 6) == -1);
  CHECK(starts_with(MXGetLastError(), "IndexError: output index 1 out of range"));
  dtype = -1;
  CHECK(MXPredGetOutputType(p, 1, &dtype) == -1 && dtype == -1);
  CHECK(MXPredFree(p) == 0);
  CHECK(MXPredFree(p) == -1);
  CHECK(MXPredFree(NULL) == 0 && MXNDListFree(NULL) == 0);
  CHECK(MXPredForward(p) == -1);
  {
    const char *keys[1] = {"data"};
    uint32_t indptr[2] = {0, 2}, s[2] = {2, 4}, bad_indptr[2] = {3, 2};
    q = NULL;
    CHECK(MXPredCreate(NULL, params, params_size, 1, 0, 1, keys, indptr, s, &q) == -1 && q == NULL);
    CHECK(starts_with(MXGetLastError(), "ValueError: symbol_json_str must not be NULL"));
    CHECK(MXPredCreate("{", params, params_size, 1, 0, 1, keys, indptr, s, &q) == -1 && q == NULL);
    CHECK(MXPredCreate(JSON, params, -1, 1, 0, 1, keys, indptr, s, &q) == -1 && q == NULL);
    CHECK(MXPredCreate(JSON, params, params_size / 2, 1, 0, 1, keys, indptr, s, &q) == -1 && q == NULL);
    CHECK(MXPredCreate(JSON, params, params_size, 1, 0, 1, keys, bad_indptr, s, &q) == -1 && q == NULL);
    CHECK(starts_with(MXGetLastError(), "ValueError: input_shape_indptr"));
    CHECK(MXPredCreate(JSON, params, params_size, 1, 0, 0, NULL, NULL, NULL, &q) == -1 && q == NULL);
    CHECK(starts_with(MXGetLastError(), "MXNetError: The shape information is not enough"));
    {
      int gpus = 0;
      CHECK(MXGetGPUCount(&gpus) == 0);
      if (gpus == 0) CHECK(MXPredCreate(JSON, params, params_size, 2, 0, 1, keys, indptr, s, &q) == -1 && q == NULL);
    }
  }

  /* Partial outputs: the FullyConnected's output, before the relu. */
  {
    const char *keys[1] = {"data"}, *outs[2] = {"fc", "relu"}, *missing[1] = {"nope"};
    uint32_t indptr[2] = {0, 2}, s[2] = {2, 4};
    float z[6];
    CHECK(MXPredCreatePartialOut(JSON, params, params_size, 1, 0, 1, keys, indptr, s, 2, outs, &q) == 0);
    input(x, 8, 3);
    CHECK(MXPredSetInput(q, "data", x, 8) == 0);
    CHECK(MXPredForward(q) == 0);
    expected(x, 2, 0, want);
    CHECK(MXPredGetOutput(q, 0, y, 6) == 0 && same(y, want, 6));
    expected(x, 2, 1, want);
    CHECK(MXPredGetOutput(q, 1, z, 6) == 0 && same(z, want, 6));
    CHECK(MXPredFree(q) == 0);
    q = NULL;
    CHECK(MXPredCreatePartialOut(JSON, params, params_size, 1, 0, 1, keys, indptr, s, 1, missing, &q) == -1);
    CHECK(starts_with(MXGetLastError(), "ValueError: didn't find node name: nope_output") && q == NULL);
  }

  /* Four predictors on four threads at once. */
  {
    const char *keys[1] = {"data"};
    uint32_t indptr[2] = {0, 2}, s[2] = {2, 4};
    pthread_t t[4];
    struct job jobs[4];
    CHECK(MXPredCreateMultiThread(JSON, params, params_size, 1, 0, 1, keys, indptr, s, 4, parts) == 0);
    for (i = 0; i < 4; ++i) {
      jobs[i].pred = parts[i];
      jobs[i].seed = i * 5;
      CHECK(parts[i] != NULL);
      pthread_create(&t[i], NULL, run_job, &jobs[i]);
    }
    for (i = 0; i < 4; ++i) {
      pthread_join(t[i], NULL);
      CHECK(jobs[i].ok);
      CHECK(MXPredFree(parts[i]) == 0);
    }
    CHECK(MXPredCreateMultiThread(JSON, params, params_size, 1, 0, 1, keys, indptr, s, 0, parts) == -1);
  }

  /* NDArray lists: the parameter file read back as float32 values with names and shapes. */
  {
    NDListHandle l = NULL;
    uint32_t n = 0;
    const char *key = NULL;
    const float *data = NULL;
    const uint32_t *dims = NULL;
    CHECK(MXNDListCreate(params, params_size, &l, &n) == 0 && n == 2);
    CHECK(MXNDListGet(l, 0, &key, &data, &dims, &ndim) == 0);
    CHECK(strcmp(key, "arg:fc_weight") == 0 && ndim == 2 && dims[0] == 3 && dims[1] == 4);
    CHECK(same(data, W, 12));
    CHECK(MXNDListGet(l, 1, &key, &data, &dims, &ndim) == 0);
    CHECK(strcmp(key, "arg:fc_bias") == 0 && ndim == 1 && dims[0] == 3 && same(data, B, 3));
    CHECK(MXNDListGet(l, 2, &key, &data, &dims, &ndim) == -1);
    CHECK(starts_with(MXGetLastError(), "IndexError: index 2 out of range"));
    CHECK(MXNDListFree(l) == 0);
    CHECK(MXNDListFree(l) == -1);
    l = NULL;
    CHECK(MXNDListCreate(params, 7, &l, &n) == -1 && l == NULL);
  }

  if (failures) {
    fprintf(stderr, "predict: %d check(s) failed\n", failures);
    return 1;
  }
  printf("predict: all checks passed\n");
  return 0;
}

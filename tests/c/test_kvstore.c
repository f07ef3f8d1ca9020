/* KVStore through <mxnet/c_api.h>: create a local and a device store, init int and string
 * keys, push lists (summed), pull, pushpull, broadcast, a C updater (called with new handles
 * it owns), 2-bit compression, the one-machine queries, and bad input (each an error, the
 * stored values kept). */
#include <mxnet/c_api.h>

#include "check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static NDArrayHandle array(const float *v, uint32_t n, int dev_id) {
  NDArrayHandle h = NULL;
  CHECK(MXNDArrayCreate(&n, 1, 1, dev_id, 0, &h) == 0);
  CHECK(MXNDArraySyncCopyFromCPU(h, v, n) == 0);
  return h;
}

static int equal(NDArrayHandle h, const float *want, size_t n) {
  float got[16];
  if (n > 16 || MXNDArraySyncCopyToCPU(h, got, n) != 0) return 0;
  for (size_t i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      fprintf(stderr, "element %zu: %g, want %g\n", i, got[i], want[i]);
      return 0;
    }
  }
  return 1;
}

static int calls = 0;
static int last_key = -1;

/* stored -= 0.5 * recv, through the library's own operators; then frees its handles. */
static void updater(int key, NDArrayHandle recv, NDArrayHandle local, void *arg) {
  NDArrayHandle scaled = NULL, *outs = &scaled, inputs[2];
  AtomicSymbolCreator mul = NULL, sub = NULL;
  int n_out = 0, n_out2 = 1;
  const char *k[1] = {"scalar"}, *v[1] = {"0.5"};
  CHECK(arg == (void *)&calls);
  calls++;
  last_key = key;
  CHECK(NNGetOpHandle("_mul_scalar", &mul) == 0);
  CHECK(NNGetOpHandle("elemwise_sub", &sub) == 0);
  CHECK(MXImperativeInvoke(mul, 1, &recv, &n_out, &outs, 1, k, v) == 0);
  scaled = outs[0];
  inputs[0] = local;
  inputs[1] = scaled;
  outs = &local;
  CHECK(MXImperativeInvoke(sub, 2, inputs, &n_out2, &outs, 0, NULL, NULL) == 0);
  MXNDArrayFree(scaled);
  MXNDArrayFree(recv);
  MXNDArrayFree(local);
}

int main(void) {
  const float zero3[3] = {0, 0, 0}, a[3] = {1, 2, 3}, b[3] = {10, 20, 30}, c[3] = {100, 200, 300};
  const char *type = NULL;
  int rank = -1, size = -1;
  KVStoreHandle kv = NULL, dev = NULL;

  CHECK(MXKVStoreCreate("local", &kv) == 0);
  CHECK(MXKVStoreGetType(kv, &type) == 0 && strcmp(type, "local") == 0);
  CHECK(MXKVStoreGetRank(kv, &rank) == 0 && rank == 0);
  CHECK(MXKVStoreGetGroupSize(kv, &size) == 0 && size == 1);
  CHECK(MXKVStoreBarrier(kv) == 0);

  /* int keys: push three arrays on three CPU contexts to key 7, pull into two outputs. */
  {
    int key = 7, keys3[3] = {7, 7, 7}, keys2[2] = {7, 7};
    NDArrayHandle init = array(zero3, 3, 0);
    NDArrayHandle vals[3] = {array(a, 3, 0), array(b, 3, 1), array(c, 3, 2)};
    NDArrayHandle outs[2] = {array(zero3, 3, 0), array(zero3, 3, 1)};
    const float sum[3] = {111, 222, 333};
    CHECK(MXKVStoreInit(kv, 1, &key, &init) == 0);
    CHECK(MXKVStorePush(kv, 3, keys3, vals, 0) == 0);
    CHECK(MXKVStorePull(kv, 2, keys2, outs, 0) == 0);
    CHECK(equal(outs[0], sum, 3) && equal(outs[1], sum, 3));
    /* pushpull into the pushed arrays themselves */
    CHECK(MXKVStorePushPull(kv, 3, keys3, 3, keys3, vals, vals, 0) == 0);
    CHECK(equal(vals[2], sum, 3));
    /* bad input: duplicate init, unknown key, wrong shape; the value is kept */
    {
      const float one[1] = {1};
      NDArrayHandle small = array(one, 1, 0);
      int unknown = 8;
      CHECK(MXKVStoreInit(kv, 1, &key, &init) == -1 && starts_with(MXGetLastError(), "MXNetError: duplicate init of key 7"));
      CHECK(MXKVStorePull(kv, 1, &unknown, outs, 0) == -1 &&
            starts_with(MXGetLastError(), "MXNetError: key 8 has not been initialized"));
      CHECK(MXKVStorePush(kv, 1, &key, &small, 0) == -1 && starts_with(MXGetLastError(), "MXNetError: shape mismatch"));
      CHECK(MXKVStorePullEx(kv, 1, (const char **)&type, outs, 0) == -1 &&
            starts_with(MXGetLastError(), "MXNetError: Mixed key types are not allowed"));
      CHECK(MXKVStorePull(kv, 1, &key, outs, 0) == 0 && equal(outs[0], sum, 3));
      MXNDArrayFree(small);
    }
    /* a C updater: called once per key and push, with handles it owns */
    CHECK(MXKVStoreSetUpdater(kv, updater, &calls) == 0);
    CHECK(MXKVStorePush(kv, 1, &key, &vals[0], 0) == 0);
    CHECK(MXKVStorePull(kv, 1, &key, outs, 0) == 0);
    {
      const float want[3] = {111 - 0.5f * 111, 222 - 0.5f * 222, 333 - 0.5f * 333};
      CHECK(calls == 1 && last_key == 7);
      CHECK(equal(outs[0], want, 3));
    }
    MXNDArrayFree(init);
    for (int i = 0; i < 3; i++) MXNDArrayFree(vals[i]);
    for (int i = 0; i < 2; i++) MXNDArrayFree(outs[i]);
  }
  CHECK(MXKVStoreFree(kv) == 0);

  /* string keys on a device store: broadcast, then 2-bit compression of pushes */
  CHECK(MXKVStoreCreate("device", &dev) == 0);
  {
    const char *w = "w", *ws[2] = {"w", "w"}, *ck[2] = {"type", "threshold"}, *cv[2] = {"2bit", "0.5"};
    const float g[3] = {0.3f, -0.7f, 0.6f}, init_v[3] = {4, 5, 6};
    NDArrayHandle init = array(init_v, 3, 0);
    NDArrayHandle outs[2] = {array(zero3, 3, 0), array(zero3, 3, 1)};
    NDArrayHandle grads[2] = {array(g, 3, 0), array(g, 3, 1)};
    CHECK(MXKVStoreBroadcastEx(dev, 1, &w, 2, ws, &init, outs, 0) == 0);
    CHECK(equal(outs[0], init_v, 3) && equal(outs[1], init_v, 3));
    CHECK(MXKVStoreSetGradientCompression(dev, 2, ck, cv) == 0);
    CHECK(MXKVStorePushPullEx(dev, 2, ws, 2, ws, grads, outs, 0) == 0);
    {
      /* each source sends 0, -0.5, 0.5 (its residual keeps the rest); the sum is twice that */
      const float want[3] = {0, -1, 1};
      CHECK(equal(outs[0], want, 3) && equal(outs[1], want, 3));
    }
    cv[0] = "1bit";
    CHECK(MXKVStoreSetGradientCompression(dev, 1, ck, cv) == -1 &&
          starts_with(MXGetLastError(), "MXNetError: Unknown type for gradient compression 1bit"));
    MXNDArrayFree(init);
    for (int i = 0; i < 2; i++) {
      MXNDArrayFree(outs[i]);
      MXNDArrayFree(grads[i]);
    }
  }
  CHECK(MXKVStoreFree(dev) == 0);

  {
    KVStoreHandle dist = NULL;
    CHECK(MXKVStoreCreate("dist_async", &dist) == -1 && starts_with(MXGetLastError(), "NotImplementedError: "));
    CHECK(dist == NULL);
    /* The role (DMLC_ROLE, or MXInitPSEnv's settings first): a server's distributed store
     * starts no MPI and has nothing to serve. */
    int is_worker = -1, is_server = -1, is_scheduler = -1;
    CHECK(MXKVStoreIsWorkerNode(&is_worker) == 0 && is_worker == 1);
    const char* keys[1] = {"DMLC_ROLE"};
    const char* server[1] = {"server"};
    CHECK(MXInitPSEnv(1, keys, server) == 0);
    CHECK(MXKVStoreIsWorkerNode(&is_worker) == 0 && is_worker == 0);
    CHECK(MXKVStoreIsServerNode(&is_server) == 0 && is_server == 1);
    CHECK(MXKVStoreIsSchedulerNode(&is_scheduler) == 0 && is_scheduler == 0);
    CHECK(MXKVStoreCreate("dist_sync", &dist) == 0 && dist != NULL);
    const char* type = NULL;
    CHECK(MXKVStoreGetType(dist, &type) == 0 && strcmp(type, "dist_sync") == 0);
    CHECK(MXKVStoreRunServer(dist, NULL, NULL) == 0);
    CHECK(MXKVStoreSetBarrierBeforeExit(dist, 1) == -1 &&
          starts_with(MXGetLastError(), "MXNetError: barrier_before_exit takes effect only on worker nodes"));
    CHECK(MXKVStoreFree(dist) == 0);
    const char* worker[1] = {"worker"};
    CHECK(MXInitPSEnv(1, keys, worker) == 0);
    CHECK(MXKVStoreIsWorkerNode(&is_worker) == 0 && is_worker == 1);
  }
  CHECK(MXNDArrayWaitAll() == 0);
  if (failures == 0) printf("kvstore: all checks passed\n");
  return failures != 0;
}

/* NDArray basics through the public header: create/free (NULL, double free), shape, dtype,
 * context, synchronous copies, waits, the engine's ND push variants, bad input, DLPack. */
#define _DEFAULT_SOURCE
#include <unistd.h>
#include <mxnet/c_api.h>

#include "check.h"

#include <stdio.h>
#include <string.h>


static const int cpu_ctx[2] = {1, 0};

typedef struct {
  NDArrayHandle src, dst;
  int ran;
} scale_job;

/* Doubles 6 floats: reads src, writes dst, through pointers fetched before the push. */
static float *src_data, *dst_data;
static void scale(void *rctx, void *param) {
  int i;
  (void)rctx;
  for (i = 0; i < 6; i++) dst_data[i] = 2.0f * src_data[i];
  ((scale_job *)param)->ran += 1;
}

/* DLPack as MXNet 1.9.1 lays it out (its header does not declare it: DLManagedTensorHandle
 * is a void*). */
typedef struct {
  int device_type, device_id;
} DLContext;
typedef struct {
  uint8_t code, bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void *data;
  DLContext ctx;
  int ndim;
  DLDataType dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* Written by whichever thread frees the array's memory. */
static int foreign_deleted = 0, foreign_bad = 0;
static void foreign_deleter(DLManagedTensor *self) {
  __sync_fetch_and_add(&foreign_deleted, 1);
  if (self == NULL || self->manager_ctx != (void *)&foreign_deleted) __sync_fetch_and_add(&foreign_bad, 1);
}

int main(void) {
  NDArrayHandle a = NULL, b = NULL, none = NULL, d = NULL;
  uint32_t shape[2] = {2, 3};
  uint32_t ndim = 0;
  const uint32_t *dims = NULL;
  int ndim_ex = 0, dtype = -2, dev_type = -1, dev_id = -1;
  const int *dims_ex = NULL;
  float in[6] = {1, 2, 3, 4, 5, 6}, out_buf[6] = {0};
  double big[6];
  scale_job job = {NULL, NULL, 0};
  int i;

  CHECK(MXNDArrayCreateEx(shape, 2, 1, 0, 0, 0, &a) == 0);
  CHECK(MXNDArrayGetShape(a, &ndim, &dims) == 0 && ndim == 2 && dims[0] == 2 && dims[1] == 3);
  CHECK(MXNDArrayGetShapeEx(a, &ndim_ex, &dims_ex) == 0 && ndim_ex == 2 && dims_ex[1] == 3);
  CHECK(MXNDArrayGetDType(a, &dtype) == 0 && dtype == 0);
  CHECK(MXNDArrayGetContext(a, &dev_type, &dev_id) == 0 && dev_type == 1 && dev_id == 0);

  CHECK(MXNDArraySyncCopyFromCPU(a, in, 6) == 0);
  CHECK(MXNDArraySyncCopyToCPU(a, out_buf, 6) == 0 && memcmp(in, out_buf, sizeof in) == 0);
  CHECK(MXNDArraySyncCopyToCPU(a, out_buf, 5) == -1); /* sizes are element counts */
  CHECK(strstr(MXGetLastError(), "5 elements") != NULL);
  CHECK(MXNDArraySyncCopyFromCPU(a, NULL, 6) == -1);

  /* A float64 array, an empty one, and bad input. */
  CHECK(MXNDArrayCreateEx(shape, 2, 1, 0, 1, 1, &d) == 0);
  for (i = 0; i < 6; i++) big[i] = i * 0.5;
  CHECK(MXNDArraySyncCopyFromCPU(d, big, 6) == 0);
  CHECK(MXNDArrayGetDType(d, &dtype) == 0 && dtype == 1);
  CHECK(MXNDArrayCreateNone(&none) == 0);
  CHECK(MXNDArrayGetDType(none, &dtype) == 0 && dtype == -1);
  CHECK(MXNDArrayGetShapeEx(none, &ndim_ex, &dims_ex) == 0 && ndim_ex == 0);
  CHECK(MXNDArrayCreateEx(shape, 2, 1, 0, 0, 9, &b) == -1);
  CHECK(strncmp(MXGetLastError(), "TypeError: unknown dtype code 9", 31) == 0);
  CHECK(MXNDArrayCreateEx(shape, 2, 2, 0, 0, 0, &b) == -1); /* no GPU */
  CHECK(MXNDArrayCreateEx(shape, 2, 4, 0, 0, 0, &b) == -1); /* unknown device type */
  CHECK(MXNDArrayCreateEx(NULL, 2, 1, 0, 0, 0, &b) == -1);
  {
    uint32_t huge[3] = {4294967295u, 4294967295u, 4294967295u};
    CHECK(MXNDArrayCreateEx(huge, 3, 1, 0, 1, 0, &b) == -1);
    CHECK(strstr(MXGetLastError(), "too large") != NULL);
  }

  /* The engine's ND variants: b = 2 * a, ordered after the copy into a, before the read. */
  CHECK(MXNDArrayCreateEx(shape, 2, 1, 0, 0, 0, &b) == 0);
  /* The function works on host buffers; the engine orders it after writes to a, before b's reads. */
  src_data = in;
  dst_data = out_buf;
  job.src = a;
  job.dst = b;
  CHECK(MXEnginePushSyncND(scale, &job, NULL, cpu_ctx, &a, 1, &b, 1, NULL, 0, "scale") == 0);
  CHECK(MXNDArrayWaitToRead(b) == 0 && job.ran == 1 && out_buf[5] == 12.0f);
  CHECK(MXEnginePushSyncND(scale, &job, NULL, cpu_ctx, &a, 1, &a, 1, NULL, 0, NULL) == -1);
  CHECK(MXEnginePushSyncND(scale, &job, NULL, cpu_ctx, &none, 1, &b, 1, NULL, 0, NULL) == -1);
  CHECK(MXNDArrayWaitToWrite(a) == 0);
  CHECK(MXNDArrayWaitAll() == 0);

  /* Free: NULL is fine, a second free is detected, a freed handle is refused. */
  CHECK(MXNDArrayFree(NULL) == 0);
  CHECK(MXNDArrayFree(a) == 0);
  CHECK(MXNDArrayFree(a) == -1 && strstr(MXGetLastError(), "already freed") != NULL);
  CHECK(MXNDArrayGetDType(a, &dtype) == -1);
  CHECK(MXNDArrayWaitToRead((NDArrayHandle)0x42) == -1);
  CHECK(MXNDArrayFree(b) == 0 && MXNDArrayFree(d) == 0 && MXNDArrayFree(none) == 0);

  /* Views share storage; reshape codes; data pointer; grad state; numpy shape; files. */
  {
    NDArrayHandle base = NULL, sl = NULL, row = NULL, re = NULL, copy = NULL, loaded_h = NULL, empty = NULL;
    float vals[6] = {0, 1, 2, 3, 4, 5}, got[6] = {0};
    int64_t spec[2] = {-1, 0};
    void *data = NULL;
    int state = -1, mode = -1, stype = -9;
    uint32_t n = 0, nn = 0;
    NDArrayHandle *loaded = NULL;
    const char **names = NULL;
    const char *keys[1] = {"weights"};
    CHECK(MXNDArrayCreateEx(shape, 2, 1, 0, 0, 0, &base) == 0);
    CHECK(MXNDArraySyncCopyFromCPU(base, vals, 6) == 0);
    CHECK(MXNDArraySlice(base, 1, 2, &sl) == 0);
    CHECK(MXNDArrayGetShape(sl, &ndim, &dims) == 0 && ndim == 2 && dims[0] == 1 && dims[1] == 3);
    CHECK(MXNDArraySyncCopyToCPU(sl, got, 3) == 0 && got[0] == 3 && got[2] == 5);
    CHECK(MXNDArraySlice(base, 1, 3, &b) == -1 && strncmp(MXGetLastError(), "IndexError", 10) == 0);
    CHECK(MXNDArrayAt(base, 0, &row) == 0);
    CHECK(MXNDArrayGetShape(row, &ndim, &dims) == 0 && ndim == 1 && dims[0] == 3);
    CHECK(MXNDArrayAt(base, 2, &b) == -1);
    CHECK(MXNDArrayReshape64(base, 2, spec, 0, &re) == 0);
    CHECK(MXNDArrayGetShape(re, &ndim, &dims) == 0 && ndim == 2 && dims[0] == 2 && dims[1] == 3);
    /* Fewer elements view the leading ones outside numpy-shape mode (stock's C call); more fail. */
    spec[0] = 4;
    CHECK(MXNDArrayReshape64(base, 1, spec, 0, &b) == 0);
    CHECK(MXNDArrayGetShape(b, &ndim, &dims) == 0 && ndim == 1 && dims[0] == 4 && MXNDArrayFree(b) == 0);
    spec[0] = 7;
    CHECK(MXNDArrayReshape64(base, 1, spec, 0, &b) == -1 && strstr(MXGetLastError(), "cannot reshape") != NULL);
    CHECK(MXNDArrayGetData(row, &data) == 0 && data != NULL && ((float *)data)[1] == 1.0f);
    /* Freeing the base keeps the views' memory alive. */
    CHECK(MXShallowCopyNDArray(base, &copy) == 0);
    CHECK(MXNDArrayFree(base) == 0);
    CHECK(MXNDArraySyncCopyToCPU(copy, got, 6) == 0 && got[5] == 5);
    CHECK(MXNDArrayGetGradState(copy, &state) == 0 && state == 0);
    CHECK(MXNDArraySetGradState(copy, 1) == 0 && MXNDArrayGetGradState(sl, &state) == 0 && state == 1);
    CHECK(MXNDArrayGetStorageType(copy, &stype) == 0 && stype == 0);
    CHECK(MXNDArrayCreateNone(&empty) == 0);
    CHECK(MXNDArrayGetStorageType(empty, &stype) == 0 && stype == -1);
    CHECK(MXNDArrayCreateSparseEx(1, shape, 2, 1, 0, 0, 0, 0, NULL, NULL, NULL, &b) == -1);
    CHECK(strncmp(MXGetLastError(), "NotImplementedError: sparse storage", 35) == 0);
    CHECK(MXSetIsNumpyShape(1, &mode) == 0 && mode == 0);
    CHECK(MXIsNumpyShape(&mode) == 0 && mode == 1);
    CHECK(MXNDArrayGetShapeEx(empty, &ndim_ex, &dims_ex) == 0 && ndim_ex == -1);
    CHECK(MXSetIsNumpyShape(0, &mode) == 0 && mode == 1);
    CHECK(MXSetIsNumpyShape(7, &mode) == -1);
    /* A file round trip with a name. */
    CHECK(MXNDArraySave("test_ndarray.nd", 1, &copy, keys) == 0);
    CHECK(MXNDArrayLoad("test_ndarray.nd", &n, &loaded, &nn, &names) == 0);
    CHECK(n == 1 && nn == 1 && strcmp(names[0], "weights") == 0);
    loaded_h = loaded[0];
    CHECK(MXNDArraySyncCopyToCPU(loaded_h, got, 6) == 0 && got[4] == 4);
    CHECK(MXNDArrayFree(loaded_h) == 0);
    CHECK(MXNDArrayLoad("no/such/file.nd", &n, &loaded, &nn, &names) == -1);
    remove("test_ndarray.nd");
    CHECK(MXNDArrayFree(sl) == 0 && MXNDArrayFree(row) == 0 && MXNDArrayFree(re) == 0);
    CHECK(MXNDArrayFree(copy) == 0 && MXNDArrayFree(empty) == 0);
  }

  /* Hostile sizes (issue 34): a shape whose product wraps, an index far past the end, more
   * than 32 dimensions. Each is refused; nothing reads outside the array. */
  {
    NDArrayHandle base = NULL, v = NULL;
    const uint32_t s46[2] = {4, 6};
    int64_t wrap[2] = {((int64_t)1 << 62) + 6, 4};
    int wrap32[3] = {2147418113, 1288529511, 40};
    int64_t ones41[41];
    uint32_t dims33[33];
    float buf[24] = {0};
    int i;
    for (i = 0; i < 41; i++) ones41[i] = 1;
    for (i = 0; i < 33; i++) dims33[i] = 1;
    CHECK(MXNDArrayCreateEx(s46, 2, 1, 0, 0, 0, &base) == 0);
    CHECK(MXNDArraySyncCopyFromCPU(base, buf, 24) == 0);
    CHECK(MXNDArrayReshape64(base, 2, wrap, 0, &v) == -1 && strstr(MXGetLastError(), "too large") != NULL);
    CHECK(MXNDArrayReshape(base, 3, wrap32, &v) == -1 && strstr(MXGetLastError(), "too large") != NULL);
    CHECK(MXNDArrayAt64(base, (int64_t)1 << 40, &v) == -1 && strncmp(MXGetLastError(), "IndexError", 10) == 0);
    CHECK(MXNDArraySlice64(base, 0, (int64_t)1 << 40, &v) == -1);
    CHECK(MXNDArrayReshape64(base, 41, ones41, 0, &v) == -1 && strstr(MXGetLastError(), "at most 32") != NULL);
    CHECK(MXNDArrayCreateEx(dims33, 33, 1, 0, 0, 0, &v) == -1 && strstr(MXGetLastError(), "at most 32") != NULL);
    CHECK(MXNDArraySyncCopyToCPU(base, buf, 24) == 0);
    CHECK(MXNDArrayFree(base) == 0);
    /* A file that is not an NDArray list is refused at its header, not read whole. */
    {
      uint32_t n = 0, nn = 0;
      NDArrayHandle *loaded = NULL;
      const char **names = NULL;
      CHECK(MXNDArrayLoad("/dev/zero", &n, &loaded, &nn, &names) == -1);
      CHECK(strstr(MXGetLastError(), "not an NDArray list") != NULL);
    }
  }

  /* Views taken through the 64-bit entry points are recorded under autograd, as the 32-bit
   * ones are: the gradient flows back to the rows viewed. */
  {
    uint32_t s23[2] = {2, 3};
    uint32_t req = 1; /* write */
    float x_in[6] = {1, 2, 3, 4, 5, 6}, grad[6] = {0};
    const float want_at[6] = {0, 0, 0, 1, 1, 1}, want_slice[6] = {1, 1, 1, 0, 0, 0};
    NDArrayHandle x = NULL, g = NULL, view = NULL;
    int prev = 0, k;
    for (k = 0; k < 2; k++) {
      CHECK(MXNDArrayCreateEx(s23, 2, 1, 0, 0, 0, &x) == 0 && MXNDArrayCreateEx(s23, 2, 1, 0, 0, 0, &g) == 0);
      CHECK(MXNDArraySyncCopyFromCPU(x, x_in, 6) == 0 && MXNDArraySyncCopyFromCPU(g, grad, 6) == 0);
      CHECK(MXAutogradMarkVariables(1, &x, &req, &g) == 0);
      CHECK(MXAutogradSetIsRecording(1, &prev) == 0);
      CHECK((k == 0 ? MXNDArrayAt64(x, 1, &view) : MXNDArraySlice64(x, 0, 1, &view)) == 0);
      CHECK(MXAutogradSetIsRecording(0, &prev) == 0);
      CHECK(MXAutogradBackwardEx(1, &view, NULL, 0, NULL, 0, 0, 1, NULL, NULL) == 0);
      CHECK(MXNDArraySyncCopyToCPU(g, grad, 6) == 0);
      CHECK(memcmp(grad, k == 0 ? want_at : want_slice, sizeof grad) == 0);
      memset(grad, 0, sizeof grad);
      CHECK(MXNDArrayFree(view) == 0 && MXNDArrayFree(g) == 0 && MXNDArrayFree(x) == 0);
    }
  }

  /* Storage: statistics per context, and emptying the cache. */
  {
    const char *json = NULL;
    CHECK(MXStorageGetStats(&json) == 0 && strstr(json, "\"cpu(0)\"") != NULL);
    CHECK(strstr(json, "\"cache_hits\"") != NULL && strstr(json, "\"pool_type\":\"Naive\"") != NULL);
    /* Freed arrays reach the cache once the finished operations that used them are dropped,
     * which an idle worker may still be doing after the wait: empty until none come back. */
    CHECK(MXNDArrayWaitAll() == 0);
    {
      int tries = 0, empty_now = 0;
      while (!empty_now && tries++ < 200) {
        CHECK(MXStorageEmptyCache(1, 0) == 0);
        CHECK(MXStorageGetStats(&json) == 0);
        empty_now = strstr(json, "\"bytes_cached\":0") != NULL;
        if (!empty_now) usleep(1000);
      }
      CHECK(empty_now);
    }
    CHECK(MXStorageEmptyCache(2, 0) == -1); /* no GPU */
    CHECK(MXStorageEmptyCache(9, 0) == -1);
  }

  /* DLPack: an array's memory handed out and taken back without a copy; deleters run once. */
  {
    const uint32_t shape[2] = {2, 3};
    const float v[6] = {1, 2, 3, 4, 5, 6};
    float got[6];
    NDArrayHandle a = NULL, b = NULL, c = NULL;
    DLManagedTensorHandle t = NULL, unused = NULL;
    DLManagedTensor *m;
    void *pa = NULL, *pb = NULL;
    int32_t mem[4] = {1, 2, 3, 4};
    int64_t fshape[2] = {2, 2}, fstrides[2] = {1, 1};
    DLManagedTensor foreign;
    CHECK(MXNDArrayCreate(shape, 2, 1, 0, 0, &a) == 0);
    CHECK(MXNDArraySyncCopyFromCPU(a, v, 6) == 0);
    CHECK(MXNDArrayToDLPack(a, &t) == 0 && t != NULL);
    m = (DLManagedTensor *)t;
    CHECK(m->dl_tensor.ndim == 2 && m->dl_tensor.shape[0] == 2 && m->dl_tensor.shape[1] == 3);
    CHECK(m->dl_tensor.ctx.device_type == 1 && m->dl_tensor.dtype.code == 2 && m->dl_tensor.dtype.bits == 32);
    CHECK(m->dl_tensor.strides == NULL && m->deleter != NULL && ((float *)m->dl_tensor.data)[5] == 6);
    CHECK(MXNDArrayFromDLPackEx(t, false, &b) == 0);
    CHECK(MXNDArrayGetData(a, &pa) == 0 && MXNDArrayGetData(b, &pb) == 0 && pa == pb);
    CHECK(MXNDArrayFree(a) == 0); /* b (through the tensor) keeps the memory */
    CHECK(MXNDArraySyncCopyToCPU(b, got, 6) == 0 && got[0] == 1 && got[5] == 6);
    CHECK(MXNDArrayFree(b) == 0); /* runs the tensor's deleter (valgrind: once) */
    /* One of ours handed back transiently (a copy of the struct, as stock's own import
     * makes): the same array again; the deleter reads its owner from manager_ctx. */
    CHECK(MXNDArrayCreate(shape, 2, 1, 0, 0, &a) == 0);
    CHECK(MXNDArraySyncCopyFromCPU(a, v, 6) == 0);
    CHECK(MXNDArrayToDLPack(a, &t) == 0);
    {
      DLManagedTensor copy = *(DLManagedTensor *)t;
      CHECK(MXNDArrayFromDLPackEx(&copy, true, &b) == 0);
    }
    CHECK(MXNDArrayGetData(a, &pa) == 0 && MXNDArrayGetData(b, &pb) == 0 && pa == pb);
    CHECK(MXNDArrayFree(a) == 0);
    CHECK(MXNDArraySyncCopyToCPU(b, got, 6) == 0 && got[3] == 4);
    CHECK(MXNDArrayFree(b) == 0);
    /* A tensor nobody consumes is deleted through the library. */
    CHECK(MXNDArrayCreate(shape, 2, 1, 0, 0, &a) == 0);
    CHECK(MXNDArrayToDLPack(a, &unused) == 0);
    CHECK(MXNDArrayFree(a) == 0);
    CHECK(MXNDArrayCallDLPackDeleter(unused) == 0);
    CHECK(MXNDArrayCallDLPackDeleter(NULL) == 0);
    /* A foreign int32 tensor, handed over transiently (the struct may go right after). */
    memset(&foreign, 0, sizeof foreign);
    foreign.dl_tensor.data = mem;
    foreign.dl_tensor.ctx.device_type = 1;
    foreign.dl_tensor.ndim = 2;
    foreign.dl_tensor.dtype.code = 0;
    foreign.dl_tensor.dtype.bits = 32;
    foreign.dl_tensor.dtype.lanes = 1;
    foreign.dl_tensor.shape = fshape;
    foreign.dl_tensor.strides = fstrides; /* not compact: refused, nothing deleted */
    foreign.manager_ctx = &foreign_deleted;
    foreign.deleter = foreign_deleter;
    CHECK(MXNDArrayFromDLPackEx(&foreign, true, &c) == -1 && c == NULL);
    CHECK(starts_with(MXGetLastError(), "NotImplementedError: a strided DLPack tensor"));
    fstrides[0] = 2;
    CHECK(MXNDArrayFromDLPackEx(&foreign, true, &c) == 0);
    memset(&foreign, 0, sizeof foreign);
    {
      int dtype = -1;
      int32_t back[4] = {0, 0, 0, 0};
      CHECK(MXNDArrayGetDType(c, &dtype) == 0 && dtype == 4);
      CHECK(MXNDArraySyncCopyToCPU(c, back, 4) == 0 && back[3] == 4);
    }
    CHECK(__sync_fetch_and_add(&foreign_deleted, 0) == 0);
    CHECK(MXNDArrayFree(c) == 0);
    CHECK(MXNDArrayWaitAll() == 0);
    {
      /* The memory goes back once the finished copy that read it is dropped too, which a
       * worker may still be doing after the wait. */
      int tries = 0;
      while (__sync_fetch_and_add(&foreign_deleted, 0) == 0 && tries++ < 200) usleep(1000);
      CHECK(__sync_fetch_and_add(&foreign_deleted, 0) == 1);
      CHECK(__sync_fetch_and_add(&foreign_bad, 0) == 0);
    }
  }

  if (failures != 0) {
    fprintf(stderr, "ndarray: %d checks failed\n", failures);
    return 1;
  }
  printf("ndarray: all checks passed\n");
  return 0;
}

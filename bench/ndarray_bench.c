/* NDArray and storage costs through the C ABI, for any libmxnet.so (loaded from
 * MXNET_LIBRARY_PATH). Prints JSON lines.
 *
 *   ndarray_bench create N REPS   create + free of a small float32 array
 *   ndarray_bench copy MiB REPS   MXNDArraySyncCopyFromCPU of MiB, and memcpy of the same size
 *   ndarray_bench free N REPS     MXNDArrayFree of N arrays from a second thread (as DataLoader
 *                                 and custom-operator threads free), after the main thread has
 *                                 pushed an operation; and from the main thread
 */
#define _POSIX_C_SOURCE 199309L
#include <mxnet/mxnet_loader.h>

#include <pthread.h>
#include <stdint.h>
#include <time.h>

typedef void *NDArrayHandle;
static int (*CreateEx)(const uint32_t *, uint32_t, int, int, int, int, NDArrayHandle *);
static int (*Free)(NDArrayHandle);
static int (*CopyFromCPU)(NDArrayHandle, const void *, size_t);
static const char *(*LastError)(void);
typedef void (*SyncFn)(void *, void *);
static int (*PushSyncND)(SyncFn, void *, void *, void *, NDArrayHandle *, int, NDArrayHandle *, int, void *, int,
                         const char *);
static int (*WaitAll)(void);

static void noop(void *rctx, void *param) {
  (void)rctx;
  (void)param;
}

struct frees {
  NDArrayHandle *h;
  long n;
  double seconds;
};

static double now(void);
static void check(int rc, const char *what);

static void *free_all(void *arg) {
  struct frees *f = arg;
  double t0 = now();
  long i;
  for (i = 0; i < f->n; i++) check(Free(f->h[i]), "free");
  f->seconds = now() - t0;
  return NULL;
}

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

int main(int argc, char **argv) {
  mxnet_loader l;
  long n, reps, r, i;
  if (argc != 4) {
    fprintf(stderr, "usage: ndarray_bench create|copy|free N REPS\n");
    return 2;
  }
  n = atol(argv[2]);
  reps = atol(argv[3]);
  if (mxnet_loader_open(&l, NULL) != 0) {
    fprintf(stderr, "%s\n", l.error);
    return 1;
  }
  if (mxnet_loader_sym(&l, "MXNDArrayCreateEx", (void **)&CreateEx) ||
      mxnet_loader_sym(&l, "MXNDArrayFree", (void **)&Free) ||
      mxnet_loader_sym(&l, "MXNDArraySyncCopyFromCPU", (void **)&CopyFromCPU) ||
      mxnet_loader_sym(&l, "MXGetLastError", (void **)&LastError) ||
      mxnet_loader_sym(&l, "MXEnginePushSyncND", (void **)&PushSyncND) ||
      mxnet_loader_sym(&l, "MXNDArrayWaitAll", (void **)&WaitAll)) {
    fprintf(stderr, "%s\n", l.error);
    return 1;
  }
  if (strcmp(argv[1], "create") == 0) {
    uint32_t shape[1] = {4};
    NDArrayHandle h;
    for (i = 0; i < 10000; i++) {
      check(CreateEx(shape, 1, 1, 0, 0, 0, &h), "create");
      check(Free(h), "free");
    }
    for (r = 0; r < reps; r++) {
      double t0 = now(), dt;
      for (i = 0; i < n; i++) {
        check(CreateEx(shape, 1, 1, 0, 0, 0, &h), "create");
        check(Free(h), "free");
      }
      dt = now() - t0;
      printf("{\"case\": \"create_free\", \"us_per_op\": %.4f}\n", dt / n * 1e6);
    }
  } else if (strcmp(argv[1], "free") == 0) {
    uint32_t shape[1] = {4};
    NDArrayHandle first, *hs = malloc(sizeof(NDArrayHandle) * n);
    int cpu[2] = {1, 0}, normal = 0; /* Context {dev_type cpu, dev_id 0}; FnProperty kNormal */
    check(CreateEx(shape, 1, 1, 0, 0, 0, &first), "create");
    /* The main thread pushes first, as the frontend's main thread does. */
    check(PushSyncND(noop, NULL, NULL, cpu, NULL, 0, &first, 1, &normal, 0, NULL), "push");
    check(WaitAll(), "wait");
    for (r = 0; r < reps; r++) {
      struct frees f = {hs, n, 0};
      pthread_t t;
      double t0, main_s;
      for (i = 0; i < n; i++) check(CreateEx(shape, 1, 1, 0, 0, 0, &hs[i]), "create");
      pthread_create(&t, NULL, free_all, &f);
      pthread_join(t, NULL);
      for (i = 0; i < n; i++) check(CreateEx(shape, 1, 1, 0, 0, 0, &hs[i]), "create");
      t0 = now();
      for (i = 0; i < n; i++) check(Free(hs[i]), "free");
      main_s = now() - t0;
      printf("{\"case\": \"free\", \"other_thread_us\": %.4f, \"main_thread_us\": %.4f}\n", f.seconds / n * 1e6,
             main_s / n * 1e6);
    }
    check(Free(first), "free");
    free(hs);
  } else if (strcmp(argv[1], "copy") == 0) {
    size_t bytes = (size_t)n << 20, floats = bytes / 4;
    uint32_t shape[1] = {(uint32_t)floats};
    char *src = malloc(bytes), *dst = malloc(bytes);
    NDArrayHandle h;
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    check(CreateEx(shape, 1, 1, 0, 0, 0, &h), "create");
    check(CopyFromCPU(h, src, floats), "copy"); /* warm: pages touched */
    for (r = 0; r < reps; r++) {
      double t0 = now(), t1, t2;
      memcpy(dst, src, bytes);
      t1 = now();
      check(CopyFromCPU(h, src, floats), "copy");
      t2 = now();
      printf("{\"case\": \"copy\", \"memcpy_gbps\": %.3f, \"copy_gbps\": %.3f}\n", bytes / (t1 - t0) / 1e9,
             bytes / (t2 - t1) / 1e9);
    }
    check(Free(h), "free");
    free(src);
    free(dst);
  }
  return 0;
}

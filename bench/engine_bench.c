/* Engine overhead, through the C ABI, for any libmxnet.so (stock or ours): the library is
 * loaded with mxnet_loader.h from MXNET_LIBRARY_PATH. The engine type comes from the
 * environment (MXNET_ENGINE_TYPE). Prints one JSON line per measurement. With
 * ENGINE_BENCH_PROFILE=1 the profiler runs (all operators, no dumps) while it measures.
 *
 *   engine_bench PATTERN N REPS     PATTERN: chain | independent | fanin | work50us
 */
#define _POSIX_C_SOURCE 199309L
#include <mxnet/mxnet_loader.h>

#include <stdint.h>
#include <time.h>

typedef void *NDArrayHandle;
typedef void (*sync_fn)(void *, void *);

static int (*CreateEx)(const uint32_t *, uint32_t, int, int, int, int, NDArrayHandle *);
static int (*Free)(NDArrayHandle);
static int (*PushSyncND)(sync_fn, void *, void (*)(void *), const void *, NDArrayHandle *, int,
                         NDArrayHandle *, int, const void *, int, const char *);
static int (*WaitAll)(void);
static const char *(*LastError)(void);
static int (*SetProfilerConfig)(int, const char *const *, const char *const *) = NULL;
static int (*SetProfilerState)(int) = NULL;

static const int cpu_ctx[2] = {1, 0};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void empty_op(void *rctx, void *param) {
  (void)rctx;
  (void)param;
}

static void busy_50us(void *rctx, void *param) {
  double end = now() + 50e-6;
  (void)rctx;
  (void)param;
  while (now() < end) {
  }
}

static void check(int rc, const char *what) {
  if (rc != 0) {
    fprintf(stderr, "%s failed: %s\n", what, LastError());
    exit(1);
  }
}

static void push(sync_fn f, NDArrayHandle *reads, int nr, NDArrayHandle *writes, int nw) {
  check(PushSyncND(f, NULL, NULL, cpu_ctx, reads, nr, writes, nw, NULL, 0, NULL), "push");
}

#define NVARS 64

int main(int argc, char **argv) {
  mxnet_loader l;
  NDArrayHandle arrays[NVARS + 1];
  uint32_t shape[1] = {1};
  const char *pattern;
  long n, i, rep, reps;
  int k;
  if (argc != 4) {
    fprintf(stderr, "usage: engine_bench chain|independent|fanin|work50us N REPS\n");
    return 2;
  }
  pattern = argv[1];
  n = atol(argv[2]);
  reps = atol(argv[3]);
  if (mxnet_loader_open(&l, NULL) != 0) {
    fprintf(stderr, "%s\n", l.error);
    return 1;
  }
  if (mxnet_loader_sym(&l, "MXNDArrayCreateEx", (void **)&CreateEx) ||
      mxnet_loader_sym(&l, "MXNDArrayFree", (void **)&Free) ||
      mxnet_loader_sym(&l, "MXEnginePushSyncND", (void **)&PushSyncND) ||
      mxnet_loader_sym(&l, "MXNDArrayWaitAll", (void **)&WaitAll) ||
      mxnet_loader_sym(&l, "MXGetLastError", (void **)&LastError)) {
    fprintf(stderr, "%s\n", l.error);
    return 1;
  }
  if (getenv("ENGINE_BENCH_PROFILE") && strcmp(getenv("ENGINE_BENCH_PROFILE"), "1") == 0) {
    static const char *keys[] = {"profile_all", "continuous_dump", "filename"};
    /* Written only at exit (no dumps while measuring); the bench script removes it. */
    static const char *vals[] = {"True", "False", "engine_bench_profile.json"};
    if (mxnet_loader_sym(&l, "MXSetProfilerConfig", (void **)&SetProfilerConfig) ||
        mxnet_loader_sym(&l, "MXSetProfilerState", (void **)&SetProfilerState)) {
      fprintf(stderr, "%s\n", l.error);
      return 1;
    }
    check(SetProfilerConfig(3, keys, vals), "profiler config");
    check(SetProfilerState(1), "profiler run");
  }
  for (k = 0; k <= NVARS; k++) check(CreateEx(shape, 1, 1, 0, 0, 0, &arrays[k]), "create");
  /* Warm up: start the pools. */
  for (k = 0; k < 1000; k++) push(empty_op, NULL, 0, &arrays[k % NVARS], 1);
  check(WaitAll(), "waitall");

  for (rep = 0; rep < reps; rep++) {
    double t0 = now(), dt;
    long ops = 0;
    if (strcmp(pattern, "chain") == 0) {
      for (i = 0; i < n; i++) push(empty_op, NULL, 0, &arrays[0], 1);
      ops = n;
    } else if (strcmp(pattern, "independent") == 0) {
      for (i = 0; i < n; i++) push(empty_op, NULL, 0, &arrays[i % NVARS], 1);
      ops = n;
    } else if (strcmp(pattern, "fanin") == 0) {
      /* Rounds of 64 independent writes, then one op reading all 64. */
      for (i = 0; i + NVARS + 1 <= n; i += NVARS + 1) {
        for (k = 0; k < NVARS; k++) push(empty_op, NULL, 0, &arrays[k], 1);
        push(empty_op, arrays, NVARS, &arrays[NVARS], 1);
        ops += NVARS + 1;
      }
    } else if (strcmp(pattern, "work50us") == 0) {
      for (i = 0; i < n; i++) push(busy_50us, NULL, 0, &arrays[i % NVARS], 1);
      ops = n;
    } else {
      fprintf(stderr, "unknown pattern %s\n", pattern);
      return 2;
    }
    check(WaitAll(), "waitall");
    dt = now() - t0;
    printf("{\"pattern\": \"%s\", \"ops\": %ld, \"seconds\": %.6f, \"us_per_op\": %.4f}\n", pattern,
           ops, dt, dt / ops * 1e6);
    fflush(stdout);
  }
  for (k = 0; k <= NVARS; k++) check(Free(arrays[k]), "free");
  if (SetProfilerState) {
    /* Stop, and drop what was recorded (a new configuration starts empty), so that no
     * trace of millions of events is written at exit. */
    static const char *key[] = {"filename"}, *val[] = {"engine_bench_profile.json"};
    check(SetProfilerState(0), "profiler stop");
    check(SetProfilerConfig(1, key, val), "profiler config");
  }
  return 0;
}

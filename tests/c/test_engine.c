/* The engine through the public header: sync and async pushes, dependencies, deleters,
 * completion from another thread, failures and recovery, bad input, bulk, fork, shutdown.
 * Run once per engine type (MXNET_ENGINE_TYPE set by CTest). */
#define _GNU_SOURCE
#include <mxnet/c_api.h>

#include "check.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


static const int cpu_ctx[2] = {1, 0};
static const int gpu_ctx[2] = {2, 0};

static int threads_in_process(void) {
  int n = 0;
  struct dirent *e;
  DIR *d = opendir("/proc/self/task");
  if (d == NULL) return -1;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] != '.') n++;
  }
  closedir(d);
  return n;
}

/* A counter incremented by sync ops; non-atomic on purpose: writes must be exclusive. */
typedef struct {
  long value;
  int deleted;
} counter;

static void increment(void *rctx, void *param) {
  (void)rctx;
  ((counter *)param)->value += 1;
}
static void mark_deleted(void *param) { ((counter *)param)->deleted += 1; }

static long shared_value = 0;
static void add_shared(void *rctx, void *param) {
  (void)rctx;
  shared_value = shared_value * 3 + (long)(size_t)param;
}

/* Async: complete from a new thread, with an error when param says so. */
typedef struct {
  void *on_complete;
  const char *error;
} completion_job;

static void *complete_later(void *arg) {
  completion_job *job = (completion_job *)arg;
  usleep(2000);
  if (MXEngineCompleteAsync(job->on_complete, job->error) != 0) {
    fprintf(stderr, "MXEngineCompleteAsync failed: %s\n", MXGetLastError());
  }
  free(job);
  return NULL;
}

static void async_fn(void *rctx, void *on_complete, void *param) {
  pthread_t t;
  completion_job *job = (completion_job *)malloc(sizeof(*job));
  (void)rctx;
  job->on_complete = on_complete;
  job->error = (const char *)param;
  pthread_create(&t, NULL, complete_later, job);
  pthread_detach(t);
}

static void *saved_token = NULL;
static void async_complete_inline(void *rctx, void *on_complete, void *param) {
  (void)rctx;
  (void)param;
  saved_token = on_complete;
  MXEngineCompleteAsync(on_complete, NULL);
}

static void slow(void *rctx, void *param) {
  (void)rctx;
  (void)param;
  usleep(1000);
}

/* A random DAG of C pushes: each operation mixes the values of the variables it reads into
 * those it writes (plain longs: a write that ran beside a conflicting operation, or out of
 * push order, changes the final values). Mostly one to three variables (the owner's compact
 * ring records), some with four or five, some named, some with a priority (other paths). */
#define DAG_VARS 8
#define DAG_OPS 20000
typedef struct {
  int vars[5];
  int n_reads, n_writes;
  long idx;
} dag_op;
static long dag_values[DAG_VARS];
static int dag_deleted = 0;
static void dag_apply(long *values, const dag_op *op) {
  long h = op->idx;
  int k;
  for (k = 0; k < op->n_reads; k++) h = h * 31 + values[op->vars[k]];
  for (k = op->n_reads; k < op->n_reads + op->n_writes; k++) {
    values[op->vars[k]] = values[op->vars[k]] * 17 + h;
  }
}
static void dag_fn(void *rctx, void *param) {
  (void)rctx;
  dag_apply(dag_values, (const dag_op *)param);
}
static void dag_delete(void *param) {
  (void)param;
  __atomic_fetch_add(&dag_deleted, 1, __ATOMIC_RELAXED);
}
static void random_dag(void) {
  static dag_op ops[DAG_OPS];
  long expect[DAG_VARS];
  EngineVarHandle vars[DAG_VARS], reads[5], writes[5];
  unsigned seed = 12345;
  int i, k;
  for (k = 0; k < DAG_VARS; k++) {
    CHECK(MXEngineNewVar(&vars[k]) == 0);
    dag_values[k] = expect[k] = k;
  }
  for (i = 0; i < DAG_OPS; i++) {
    dag_op *op = &ops[i];
    int n = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 3;
    int used = 0;
    if (i % 50 == 0) n = 4 + i % 2;
    op->idx = i;
    op->n_writes = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % n;
    op->n_reads = n - op->n_writes;
    /* n distinct variables. */
    for (k = 0; k < n; k++) {
      int v;
      do {
        v = (int)((seed = seed * 1103515245u + 12345u) >> 16) % DAG_VARS;
      } while (used & (1 << v));
      used |= 1 << v;
      op->vars[k] = v;
    }
    for (k = 0; k < op->n_reads; k++) reads[k] = vars[op->vars[k]];
    for (k = 0; k < op->n_writes; k++) writes[k] = vars[op->vars[op->n_reads + k]];
    CHECK(MXEnginePushSync(dag_fn, op, dag_delete, cpu_ctx, reads, op->n_reads, writes, op->n_writes,
                           NULL, i % 97 == 0 ? 1 : 0, i % 89 == 0 ? "named" : NULL) == 0);
    dag_apply(expect, op);
  }
  CHECK(MXNDArrayWaitAll() == 0);
  for (k = 0; k < DAG_VARS; k++) {
    CHECK(dag_values[k] == expect[k]);
    CHECK(MXEngineDeleteVar(vars[k]) == 0);
  }
  CHECK(__atomic_load_n(&dag_deleted, __ATOMIC_RELAXED) == DAG_OPS);
}

int main(void) {
  EngineVarHandle a = NULL, b = NULL, c = NULL;
  counter cnt = {0, 0};
  int i, prev = -1, prop = 3, bad_prop = 42;
  const char *engine_type = getenv("MXNET_ENGINE_TYPE");
  int naive = engine_type != NULL && strcmp(engine_type, "NaiveEngine") == 0;
  EngineVarHandle pair[2];

  CHECK(MXEngineNewVar(&a) == 0 && MXEngineNewVar(&b) == 0 && MXEngineNewVar(&c) == 0);

  random_dag();

  /* 1000 increments on one var, each with a deleter: run in order, deleter once each. */
  for (i = 0; i < 1000; i++) {
    CHECK(MXEnginePushSync(increment, &cnt, mark_deleted, cpu_ctx, NULL, 0, &a, 1, NULL, 0,
                           "increment") == 0);
  }
  CHECK(MXEngineWaitForVar(a, 0) == 0);
  CHECK(cnt.value == 1000 && cnt.deleted == 1000);
  if (naive) {
    /* NaiveEngine starts no thread, not even for a copy above MXNET_CPU_PARALLEL_COPY_SIZE. */
    static float big[300000];
    uint32_t n = 300000;
    NDArrayHandle arr = NULL;
    CHECK(MXNDArrayCreateEx(&n, 1, 1, 0, 0, 0, &arr) == 0);
    CHECK(MXNDArraySyncCopyFromCPU(arr, big, n) == 0 && MXNDArraySyncCopyToCPU(arr, big, n) == 0);
    CHECK(MXNDArrayFree(arr) == 0);
    CHECK(threads_in_process() == 1);
  }

  /* Order of conflicting writes: x = 3x + i must equal the serial result. */
  for (i = 1; i <= 10; i++) {
    CHECK(MXEnginePushSync(add_shared, (void *)(size_t)i, NULL, cpu_ctx, &c, 1, &b, 1, &prop, i,
                           NULL) == 0);
  }
  CHECK(MXNDArrayWaitAll() == 0);
  {
    long want = 0;
    for (i = 1; i <= 10; i++) want = want * 3 + i;
    CHECK(shared_value == want);
  }

  /* Async completed from another thread; then a failure that propagates to a reader. */
  CHECK(MXEnginePushAsync(async_fn, NULL, NULL, cpu_ctx, NULL, 0, &a, 1, NULL, 0, "ok_async", 0) == 0);
  CHECK(MXEngineWaitForVar(a, 1) == 0);
  CHECK(MXEnginePushAsync(async_fn, (void *)"TypeError: async op failed", NULL, cpu_ctx, NULL, 0,
                          &a, 1, NULL, 0, "bad_async", 0) == 0);
  cnt.value = 0;
  cnt.deleted = 0;
  CHECK(MXEnginePushSync(increment, &cnt, mark_deleted, cpu_ctx, &a, 1, &b, 1, NULL, 0, "skipped") == 0);
  CHECK(MXEngineWaitForVar(b, 0) == -1);
  CHECK(strcmp(MXGetLastError(), "TypeError: async op failed") == 0);
  CHECK(cnt.value == 0 && cnt.deleted == 1); /* skipped, but its deleter ran */
  CHECK(MXNDArrayWaitAll() == 0);            /* reported once */
  CHECK(MXEngineWaitForVar(a, 0) == 0);
  CHECK(MXEnginePushSync(increment, &cnt, NULL, cpu_ctx, &a, 1, &b, 1, NULL, 0, NULL) == 0);
  CHECK(MXEngineWaitForVar(b, 0) == 0 && cnt.value == 1); /* working again */

  /* A failure nobody waited for surfaces at WaitAll. */
  CHECK(MXEnginePushAsync(async_fn, (void *)"disk full", NULL, cpu_ctx, NULL, 0, &c, 1, NULL, 0,
                          NULL, 1) == 0);
  CHECK(MXNDArrayWaitAll() == -1 && strcmp(MXGetLastError(), "MXNetError: disk full") == 0);
  CHECK(MXNDArrayWaitAll() == 0);

  /* Bad input: clear errors, nothing runs, nothing is freed. */
  cnt.value = 0;
  cnt.deleted = 0;
  pair[0] = a;
  pair[1] = a;
  CHECK(MXEnginePushSync(increment, &cnt, mark_deleted, cpu_ctx, NULL, 0, pair, 2, NULL, 0, NULL) == -1);
  CHECK(strstr(MXGetLastError(), "ValueError:") == MXGetLastError());
  CHECK(MXEnginePushSync(increment, &cnt, mark_deleted, cpu_ctx, &a, 1, &a, 1, NULL, 0, NULL) == -1);
  CHECK(MXEnginePushSync(increment, &cnt, mark_deleted, NULL, NULL, 0, &a, 1, NULL, 0, NULL) == -1);
  CHECK(strstr(MXGetLastError(), "ctx_handle") != NULL);
  CHECK(MXEnginePushSync(increment, &cnt, mark_deleted, gpu_ctx, NULL, 0, &a, 1, NULL, 0, NULL) == -1);
  CHECK(strstr(MXGetLastError(), "gpu(0) is not available") != NULL);
  CHECK(MXEnginePushSync(increment, &cnt, mark_deleted, cpu_ctx, NULL, 0, &a, 1, &bad_prop, 0, NULL) == -1);
  CHECK(MXEnginePushSync(NULL, &cnt, mark_deleted, cpu_ctx, NULL, 0, &a, 1, NULL, 0, NULL) == -1);
  CHECK(MXEnginePushSync(increment, &cnt, mark_deleted, cpu_ctx, NULL, 0, &a, -1, NULL, 0, NULL) == -1);
  CHECK(MXEnginePushSync(increment, &cnt, mark_deleted, cpu_ctx, NULL, 0, NULL, 1, NULL, 0, NULL) == -1);
  CHECK(MXNDArrayWaitAll() == 0);
  CHECK(cnt.value == 0 && cnt.deleted == 0);

  /* Completing twice, deleted and bogus vars. */
  CHECK(MXEnginePushAsync(async_complete_inline, NULL, NULL, cpu_ctx, NULL, 0, &c, 1, NULL, 0, NULL, 1) == 0);
  CHECK(MXEngineCompleteAsync(saved_token, NULL) == -1);
  CHECK(strstr(MXGetLastError(), "already freed") != NULL);
  CHECK(MXEngineDeleteVar(c) == 0);
  CHECK(MXEngineDeleteVar(c) == -1); /* double free detected */
  CHECK(MXEnginePushSync(increment, &cnt, NULL, cpu_ctx, NULL, 0, &c, 1, NULL, 0, NULL) == -1);
  CHECK(MXEngineWaitForVar((EngineVarHandle)0x1234, 0) == -1);

  /* Bulk size is per thread and returns the previous value. */
  CHECK(MXEngineSetBulkSize(16, &prev) == 0 && prev == 0);
  cnt.value = 0;
  for (i = 0; i < 40; i++) {
    CHECK(MXEnginePushSync(increment, &cnt, NULL, cpu_ctx, NULL, 0, &a, 1, NULL, 0, NULL) == 0);
  }
  CHECK(MXEngineSetBulkSize(0, &prev) == 0 && prev == 16);
  CHECK(MXEngineWaitForVar(a, 0) == 0 && cnt.value == 40);
  CHECK(MXEngineSetBulkSize(-1, &prev) == -1);

  /* A forked child can use the engine (its pools are created anew there). */
  {
    pid_t pid = fork();
    if (pid == 0) {
      counter child = {0, 0};
      EngineVarHandle v = NULL;
      int ok = MXEngineNewVar(&v) == 0;
      for (i = 0; i < 100 && ok; i++) {
        ok = MXEnginePushSync(increment, &child, NULL, cpu_ctx, NULL, 0, &v, 1, NULL, 0, NULL) == 0;
      }
      ok = ok && MXNDArrayWaitAll() == 0 && child.value == 100;
      _exit(ok ? 0 : 3);
    } else {
      int status = 0;
      CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
      CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
  }

  /* Shutdown with operations in flight: returns when they are done; calls still work. */
  cnt.value = 0;
  for (i = 0; i < 50; i++) {
    CHECK(MXEnginePushSync(slow, NULL, NULL, cpu_ctx, NULL, 0, &b, 1, NULL, 0, NULL) == 0);
    CHECK(MXEnginePushSync(increment, &cnt, NULL, cpu_ctx, NULL, 0, &b, 1, NULL, 0, NULL) == 0);
  }
  CHECK(MXNotifyShutdown() == 0);
  CHECK(cnt.value == 50);
  CHECK(MXEngineDeleteVar(a) == 0 && MXEngineDeleteVar(b) == 0);

  /* Exit with operations still queued: must neither hang nor crash. */
  CHECK(MXEngineNewVar(&a) == 0);
  for (i = 0; i < 200; i++) {
    CHECK(MXEnginePushSync(slow, NULL, NULL, cpu_ctx, NULL, 0, &a, 1, NULL, 0, NULL) == 0);
  }
  if (failures != 0) {
    fprintf(stderr, "engine (%s): %d checks failed\n", engine_type ? engine_type : "default", failures);
    return 1;
  }
  printf("engine (%s): all checks passed\n", engine_type ? engine_type : "default");
  return 0;
}

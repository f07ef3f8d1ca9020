/* fork() while other threads are inside the library (issue 34, item 5): four threads loop
 * create / copy in / relu / copy out / free, and a fifth pushes C functions: synchronous ones,
 * and asynchronous ones that a thread of its own completes a little later (a fork waits for
 * them) and whose parameter deleter frees an array (a call made while completing), while the
 * main thread
 * forks; each child creates an array, copies into it, runs relu and reads the result back,
 * then exits. A child that has not
 * exited within CHILD_TIMEOUT seconds is counted as hung and killed. Run once per engine type
 * (MXNET_ENGINE_TYPE, set by CTest).
 *
 *   test_fork_stress [forks]      (default 100)
 */
#define _DEFAULT_SOURCE
#include <mxnet/c_api.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LOOPERS 4
#define CHILD_TIMEOUT 10.0
#define LEN 64

static volatile int stop = 0;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One round of create / copy in / relu / copy out / free; 0 when every call succeeded and relu
 * gave the right values. */
static int round_trip(int salt) {
  NDArrayHandle a = NULL, *outs = NULL;
  AtomicSymbolCreator relu = NULL;
  uint32_t shape[1] = {LEN};
  float in[LEN], out[LEN];
  int nout = 0, i, ok = 0;
  for (i = 0; i < LEN; i++) in[i] = (float)((i + salt) % 7) - 3.0f;
  if (MXNDArrayCreateEx(shape, 1, 1, 0, 0, 0, &a) != 0) return 1;
  if (MXNDArraySyncCopyFromCPU(a, in, LEN) == 0 && NNGetOpHandle("relu", &relu) == 0 &&
      MXImperativeInvoke(relu, 1, &a, &nout, &outs, 0, NULL, NULL) == 0 && nout == 1) {
    if (MXNDArraySyncCopyToCPU(outs[0], out, LEN) == 0) {
      ok = 1;
      for (i = 0; i < LEN; i++) ok &= out[i] == (in[i] > 0 ? in[i] : 0.0f);
    }
    MXNDArrayFree(outs[0]);
  }
  MXNDArrayFree(a);
  return ok ? 0 : 1;
}

/* An asynchronous operation completed from another thread, 0.2 ms after it starts. */
static void *complete_later(void *token) {
  usleep(200);
  if (MXEngineCompleteAsync(token, NULL) != 0) fprintf(stderr, "fork_stress: %s\n", MXGetLastError());
  return NULL;
}

static void start_async(void *rctx, void *on_complete, void *param) {
  pthread_t t;
  (void)rctx;
  (void)param;
  pthread_create(&t, NULL, complete_later, on_complete);
  pthread_detach(t);
}

static void free_array(void *param) {
  if (MXNDArrayFree((NDArrayHandle)param) != 0) fprintf(stderr, "fork_stress: %s\n", MXGetLastError());
}

static volatile long sync_runs = 0;
static void count_run(void *rctx, void *param) {
  (void)rctx;
  (void)param;
  sync_runs++;
}

static void *engine_looper(void *arg) {
  static const int cpu_ctx[2] = {1, 0};
  uint32_t shape[1] = {4};
  EngineVarHandle v = NULL;
  NDArrayHandle param = NULL;
  long failures = 0;
  (void)arg;
  if (MXEngineNewVar(&v) != 0) return (void *)1L;
  while (!stop) {
    failures += MXEnginePushSync(count_run, NULL, NULL, (ContextHandle)cpu_ctx, NULL, 0, &v, 1, NULL, 0,
                                 "sync_push") != 0;
    if (MXNDArrayCreateEx(shape, 1, 1, 0, 0, 0, &param) != 0) {
      failures++;
      continue;
    }
    failures += MXEnginePushAsync(start_async, param, free_array, (ContextHandle)cpu_ctx, NULL, 0, &v, 1, NULL, 0,
                                  "completed_later", 0) != 0;
    failures += MXEngineWaitForVar(v, 1) != 0;
  }
  failures += MXEngineDeleteVar(v) != 0;
  return (void *)failures;
}

static void *looper(void *arg) {
  long failures = 0, rounds = 0;
  int salt = (int)(long)arg;
  while (!stop) {
    failures += round_trip(salt + (int)rounds);
    rounds++;
  }
  return (void *)failures;
}

int main(int argc, char **argv) {
  int forks = argc > 1 ? atoi(argv[1]) : 100;
  pthread_t threads[LOOPERS + 1];
  int i, done_forks, hung = 0, failed = 0, loop_failures = 0;
  const char *engine = getenv("MXNET_ENGINE_TYPE");

  /* The library and its threads are running before the first fork. */
  if (round_trip(0) != 0) {
    fprintf(stderr, "fork_stress: the first round failed: %s\n", MXGetLastError());
    return 1;
  }
  for (i = 0; i < LOOPERS; i++) pthread_create(&threads[i], NULL, looper, (void *)(long)i);
  pthread_create(&threads[LOOPERS], NULL, engine_looper, NULL);

  for (i = 0; i < forks && hung == 0; i++) {
    double start;
    int status = 0;
    pid_t done = 0, pid;
    usleep(1000 + (unsigned)(i % 5) * 300);
    pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) _exit(round_trip(i) == 0 ? 0 : 3);
    start = now();
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && now() - start < CHILD_TIMEOUT) usleep(2000);
    if (done == 0) {
      hung++;
      fprintf(stderr, "fork_stress: child %d (fork %d) hung for %.0f s; killed\n", (int)pid, i, CHILD_TIMEOUT);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failed++;
      fprintf(stderr, "fork_stress: child of fork %d ended with status %d\n", i, status);
    }
  }

  done_forks = i;
  stop = 1;
  for (i = 0; i <= LOOPERS; i++) {
    void *r = NULL;
    pthread_join(threads[i], &r);
    loop_failures += (int)(long)r;
  }
  printf("fork_stress (%s): %d forks, %d hung, %d failed, %d failed rounds in the parent\n",
         engine ? engine : "default engine", done_forks, hung, failed, loop_failures);
  if (sync_runs == 0) fprintf(stderr, "fork_stress: no pushed function ran\n");
  return hung == 0 && failed == 0 && loop_failures == 0 && sync_runs > 0 ? 0 : 1;
}

/* mxnet-rt from C: profile a small workload (seed 004's steps), then print the aggregate
 * statistics and write a chrome://tracing / Perfetto file.
 * Build: see CMakeLists.txt (find_package(MXNet CONFIG) -> MXNet::mxnet).
 * Usage: profile_c [trace.json]   (default: profile_c.json in the working directory) */
#include <mxnet/c_api.h>

#include <stdio.h>
#include <string.h>

#define CALL(expr)                                                      \
  do {                                                                  \
    if ((expr) != 0) {                                                  \
      fprintf(stderr, "%s failed: %s\n", #expr, MXGetLastError());      \
      return 1;                                                         \
    }                                                                   \
  } while (0)

/* out = op(inputs...) with string parameters; the output is allocated by the library. */
static int invoke(const char *op, NDArrayHandle *in, int n_in, NDArrayHandle *out, int n_params,
                  const char **keys, const char **vals) {
  OpHandle h = NULL;
  NDArrayHandle *outs = NULL;
  int n_out = 0;
  if (NNGetOpHandle(op, &h) != 0) return -1;
  if (MXImperativeInvoke(h, n_in, in, &n_out, &outs, n_params, keys, vals) != 0) return -1;
  *out = outs[0];
  return 0;
}

int main(int argc, char **argv) {
  const char *file = argc > 1 ? argv[1] : "profile_c.json";
  const char *cfg_keys[] = {"profile_all", "aggregate_stats", "continuous_dump", "filename"};
  const char *cfg_vals[] = {"True", "True", "False", file};
  const char *shape_key[] = {"shape"}, *shape_val[] = {"(256, 256)"};
  const char *scalar_key[] = {"scalar"}, *scalar_val[] = {"1.5"};
  const char *stats = NULL;
  NDArrayHandle a = NULL, b = NULL, c = NULL;
  ProfileHandle domain = NULL, task = NULL;
  int i;

  CALL(MXSetProfilerConfig(4, cfg_keys, cfg_vals));
  CALL(MXSetProfilerState(1));
  CALL(MXProfileCreateDomain("example", &domain));
  CALL(MXProfileCreateTask(domain, "workload", &task));
  CALL(MXProfileDurationStart(task));

  CALL(invoke("_ones", NULL, 0, &a, 1, shape_key, shape_val));
  for (i = 0; i < 5; i++) {
    NDArrayHandle in[2];
    in[0] = a;
    in[1] = a;
    CALL(invoke("dot", in, 2, &b, 0, NULL, NULL));
    CALL(invoke("_plus_scalar", &b, 1, &c, 1, scalar_key, scalar_val));
    CALL(MXNDArrayFree(b));
    CALL(MXNDArrayFree(c));
  }
  CALL(MXNDArrayWaitAll());
  CALL(MXProfileDurationStop(task));
  CALL(MXProfileSetMarker(domain, "workload done", "process"));

  CALL(MXSetProfilerState(0));
  CALL(MXDumpProfile(1));
  /* Table (format 0), sorted by total time (0), descending. */
  CALL(MXAggregateProfileStatsPrintEx(&stats, 0, 0, 0, 0));
  printf("%s", stats);
  if (strstr(stats, "dot") == NULL || strstr(stats, "_plus_scalar") == NULL) {
    fprintf(stderr, "profile_c: the statistics lack the workload's operators\n");
    return 1;
  }
  printf("trace written to %s\n", file);

  CALL(MXProfileDestroyHandle(task));
  CALL(MXNDArrayFree(a));
  return 0;
}

/* The operator C API through the public header: the registry (names, handles, aliases, the
 * documentation the frontend parses), imperative invocation (allocated and caller-given
 * outputs, in-place, num_args insertion, out_stypes), random seeds, and bad input (unknown
 * names, bad handles, bad parameters, wrong input counts and shapes). */
#include <mxnet/c_api.h>

#include "check.h"

#include <stdio.h>
#include <string.h>


static NDArrayHandle make(const uint32_t *shape, uint32_t ndim, const float *data, size_t n) {
  NDArrayHandle h = NULL;
  CHECK(MXNDArrayCreateEx(shape, ndim, 1, 0, 0, 0, &h) == 0);
  if (data) CHECK(MXNDArraySyncCopyFromCPU(h, data, n) == 0);
  return h;
}

static void read_into(NDArrayHandle h, float *out, size_t n) { CHECK(MXNDArraySyncCopyToCPU(h, out, n) == 0); }

int main(void) {
  uint32_t n_names = 0, n_creators = 0, i, n_args = 0;
  const char **names = NULL, *name = NULL, *desc = NULL, *key = NULL, *ret = NULL;
  const char **arg_names = NULL, **arg_types = NULL, **arg_descs = NULL;
  AtomicSymbolCreator *creators = NULL;
  OpHandle add = NULL, plus = NULL, zeros = NULL, bogus = NULL, full = NULL;
  uint32_t shape[2] = {2, 3};
  float a_data[6] = {1, 2, 3, 4, 5, 6}, b_data[6] = {10, 20, 30, 40, 50, 60}, got[6];
  NDArrayHandle a, b, c, ins[2], *outs = NULL;
  int n_out = 0;
  const int *stypes = NULL;
  const char *keys[2], *vals[2];
  int found_add = 0;

  /* Registry: names include aliases; every name resolves; aliases share the handle. */
  CHECK(MXListAllOpNames(&n_names, &names) == 0);
  CHECK(n_names > 10);
  for (i = 0; i < n_names; i++) {
    OpHandle h = NULL;
    CHECK(NNGetOpHandle(names[i], &h) == 0 && h != NULL);
    CHECK(MXSymbolGetAtomicSymbolInfo(h, &name, &desc, &n_args, &arg_names, &arg_types, &arg_descs, &key, &ret) == 0);
    CHECK(name != NULL && desc != NULL && key != NULL);
    if (strcmp(names[i], "elemwise_add") == 0) found_add = 1;
  }
  CHECK(found_add);
  CHECK(MXSymbolListAtomicSymbolCreators(&n_creators, &creators) == 0);
  CHECK(n_creators > 0 && n_creators <= n_names);
  CHECK(NNGetOpHandle("elemwise_add", &add) == 0);
  CHECK(NNGetOpHandle("_plus", &plus) == 0);
  CHECK(add == plus);
  CHECK(MXSymbolGetAtomicSymbolName(plus, &name) == 0 && strcmp(name, "elemwise_add") == 0);
  CHECK(MXSymbolGetAtomicSymbolInfo(add, &name, &desc, &n_args, &arg_names, &arg_types, &arg_descs, &key, &ret) == 0);
  CHECK(n_args == 2 && strcmp(arg_names[0], "lhs") == 0 && strcmp(arg_types[1], "NDArray-or-Symbol") == 0);
  CHECK(strcmp(key, "") == 0 && ret == NULL);
  CHECK(NNGetOpInfo(add, &name, &desc, &n_args, &arg_names, &arg_types, &arg_descs, &ret) == 0 && n_args == 2);
  CHECK(NNGetOpHandle("_zeros", &zeros) == 0);
  CHECK(MXSymbolGetAtomicSymbolInfo(zeros, &name, &desc, &n_args, &arg_names, &arg_types, &arg_descs, &key, &ret) == 0);
  CHECK(n_args == 3 && strcmp(arg_names[0], "shape") == 0 && strstr(arg_types[0], "Shape(tuple)") != NULL);
  CHECK(NNGetOpHandle("no_such_op", &bogus) == -1 && strstr(MXGetLastError(), "no_such_op") != NULL);
  CHECK(MXSymbolGetAtomicSymbolName((AtomicSymbolCreator)(uintptr_t)0x1000, &name) == -1);
  CHECK(MXSymbolGetAtomicSymbolName(NULL, &name) == -1);

  /* Invoke with allocated outputs. */
  a = make(shape, 2, a_data, 6);
  b = make(shape, 2, b_data, 6);
  ins[0] = a;
  ins[1] = b;
  CHECK(MXImperativeInvokeEx(add, 2, ins, &n_out, &outs, 0, NULL, NULL, &stypes) == 0);
  CHECK(n_out == 1 && outs != NULL && stypes != NULL && stypes[0] == 0);
  c = outs[0];
  read_into(c, got, 6);
  for (i = 0; i < 6; i++) CHECK(got[i] == a_data[i] + b_data[i]);
  /* Into a caller's output, and in place (a += b). */
  n_out = 1;
  outs = &a;
  CHECK(MXImperativeInvokeEx(add, 2, ins, &n_out, &outs, 0, NULL, NULL, &stypes) == 0);
  read_into(a, got, 6);
  for (i = 0; i < 6; i++) CHECK(got[i] == a_data[i] + b_data[i]);
  /* The non-Ex form. */
  n_out = 0;
  outs = NULL;
  CHECK(MXImperativeInvoke(add, 2, ins, &n_out, &outs, 0, NULL, NULL) == 0 && n_out == 1);
  CHECK(MXNDArrayFree(outs[0]) == 0);

  /* Parameters: a creation op on a context, strict parsing naming the op and parameter. */
  CHECK(NNGetOpHandle("_full", &full) == 0);
  keys[0] = "shape", vals[0] = "(2, 3)";
  keys[1] = "value", vals[1] = "2.5";
  n_out = 0;
  outs = NULL;
  CHECK(MXImperativeInvokeEx(full, 0, NULL, &n_out, &outs, 2, keys, vals, &stypes) == 0 && n_out == 1);
  read_into(outs[0], got, 6);
  for (i = 0; i < 6; i++) CHECK(got[i] == 2.5f);
  CHECK(MXNDArrayFree(outs[0]) == 0);
  vals[1] = "two";
  n_out = 0;
  CHECK(MXImperativeInvokeEx(full, 0, NULL, &n_out, &outs, 2, keys, vals, &stypes) == -1);
  CHECK(strncmp(MXGetLastError(), "MXNetError:", 11) == 0 && strstr(MXGetLastError(), "'value'") != NULL &&
        strstr(MXGetLastError(), "_full") != NULL);
  keys[1] = "nonsense", vals[1] = "1";
  CHECK(MXImperativeInvokeEx(full, 0, NULL, &n_out, &outs, 2, keys, vals, &stypes) == -1);
  CHECK(strstr(MXGetLastError(), "nonsense") != NULL);
  CHECK(MXImperativeInvokeEx(full, 0, NULL, &n_out, &outs, 1, keys, vals, &stypes) == -1); /* value missing */
  CHECK(strstr(MXGetLastError(), "required parameter 'value'") != NULL);

  /* Bad inputs: wrong count, mismatched shapes, freed handles, bad op handle. */
  n_out = 0;
  CHECK(MXImperativeInvokeEx(add, 1, ins, &n_out, &outs, 0, NULL, NULL, &stypes) == -1);
  CHECK(strstr(MXGetLastError(), "expects 2 inputs") != NULL);
  {
    uint32_t s2[1] = {4};
    NDArrayHandle d = make(s2, 1, a_data, 4), bad[2];
    bad[0] = a;
    bad[1] = d;
    CHECK(MXImperativeInvokeEx(add, 2, bad, &n_out, &outs, 0, NULL, NULL, &stypes) == -1);
    CHECK(strncmp(MXGetLastError(), "MXNetError:", 11) == 0); /* stock class for operator checks */
    CHECK(MXNDArrayFree(d) == 0);
    bad[1] = d; /* freed */
    CHECK(MXImperativeInvokeEx(add, 2, bad, &n_out, &outs, 0, NULL, NULL, &stypes) == -1);
  }
  CHECK(MXImperativeInvokeEx(NULL, 2, ins, &n_out, &outs, 0, NULL, NULL, &stypes) == -1);
  CHECK(MXImperativeInvokeEx(add, 2, ins, &n_out, &outs, 0, NULL, NULL, NULL) == -1);

  /* Seeds. */
  CHECK(MXRandomSeed(7) == 0);
  CHECK(MXRandomSeedContext(7, 1, 0) == 0);
  CHECK(MXRandomSeedContext(7, 9, 0) == -1);

  CHECK(MXNDArrayFree(a) == 0);
  CHECK(MXNDArrayFree(b) == 0);
  CHECK(MXNDArrayFree(c) == 0);
  CHECK(MXNDArrayWaitAll() == 0);
  if (failures == 0) printf("ops: all checks passed\n");
  return failures != 0;
}

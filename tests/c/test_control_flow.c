/* Control flow through the public header, as the stock frontend builds it
 * (mx.sym.contrib.foreach): a loop body marked with __subgraph_name__, cut from the outer
 * graph with MXSymbolCutSubgraph, composed with _foreach (its first argument is the graph), bound and
 * run; the JSON round trip; parameters that do not fit the graph refused.
 * The loop: out_t = x_t * w + s_t, s_{t+1} = out_t, over data (3, 2) from init (2,). */
#include <mxnet/c_api.h>

#include "check.h"

#include <stdio.h>
#include <string.h>

static SymbolHandle marked_var(const char *name) {
  SymbolHandle v = NULL;
  CHECK(MXSymbolCreateVariable(name, &v) == 0);
  CHECK(MXSymbolSetAttr(v, "__subgraph_name__", "fe0") == 0);
  return v;
}

/* op(args...) named `name`, marked as part of the loop body. */
static SymbolHandle marked_op(const char *op_name, const char *name, uint32_t n, SymbolHandle *args) {
  OpHandle op = NULL;
  SymbolHandle s = NULL;
  CHECK(NNGetOpHandle(op_name, &op) == 0);
  CHECK(MXSymbolCreateAtomicSymbol(op, 0, NULL, NULL, &s) == 0);
  CHECK(MXSymbolCompose(s, name, n, NULL, args) == 0);
  CHECK(MXSymbolSetAttr(s, "__subgraph_name__", "fe0") == 0);
  return s;
}

static SymbolHandle foreach_op(const char *num_args) {
  OpHandle op = NULL;
  SymbolHandle s = NULL;
  const char *keys[6] = {"num_args", "num_outputs", "num_out_data", "in_data_locs", "in_state_locs", "remain_locs"};
  const char *vals[6] = {num_args, "2", "1", "(0,)", "(2,)", "(1,)"};
  CHECK(NNGetOpHandle("_foreach", &op) == 0);
  CHECK(MXSymbolCreateAtomicSymbol(op, 6, keys, vals, &s) == 0);
  return s;
}

int main(void) {
  SymbolHandle x = marked_var("x"), s = marked_var("s"), w = NULL, xw = NULL, out = NULL, body = NULL;
  SymbolHandle *cut = NULL, data = NULL, init = NULL, loop = NULL, reloaded = NULL, bad = NULL;
  int n_cut = 0, i;
  CHECK(MXSymbolCreateVariable("w", &w) == 0); /* outside the body: cut off */
  {
    SymbolHandle a[2] = {x, w};
    xw = marked_op("elemwise_mul", "xw", 2, a);
  }
  {
    SymbolHandle a[2] = {xw, s};
    out = marked_op("elemwise_add", "out", 2, a);
  }
  {
    SymbolHandle heads[2] = {out, out};
    CHECK(MXSymbolCreateGroup(2, heads, &body) == 0);
  }
  CHECK(MXSymbolCutSubgraph(body, &cut, &n_cut) == 0);
  CHECK(n_cut == 1);
  {
    uint32_t n = 0;
    const char **names = NULL;
    CHECK(MXSymbolListArguments(body, &n, &names) == 0);
    CHECK(n == 3 && strcmp(names[0], "x") == 0 && strcmp(names[1], "w") == 0 && strcmp(names[2], "s") == 0);
  }
  CHECK(MXSymbolCreateVariable("data", &data) == 0);
  CHECK(MXSymbolCreateVariable("init", &init) == 0);
  loop = foreach_op("4");
  if (n_cut == 1) {
    SymbolHandle args[4] = {body, data, init, cut[0]};
    CHECK(MXSymbolCompose(loop, "loop", 4, NULL, args) == 0);
  }
  for (i = 0; i < n_cut; i++) CHECK(MXSymbolFree(cut[i]) == 0);

  /* Bound and run: the running sums of x * w from init. */
  {
    const float xs[6] = {1, 2, 3, 4, 5, 6}, s0[2] = {10, 20}, ws[2] = {2, 1};
    const float want0[6] = {12, 22, 18, 26, 28, 32}, want1[2] = {28, 32};
    float got0[6] = {0}, got1[2] = {0};
    uint32_t d2[2] = {3, 2}, d1[1] = {2}, grad_req[3] = {0, 0, 0}, n_out = 0;
    NDArrayHandle args[3] = {NULL, NULL, NULL}, grads[3] = {NULL, NULL, NULL}, *outs = NULL;
    ExecutorHandle e = NULL;
    CHECK(MXNDArrayCreate(d2, 2, 1, 0, 0, &args[0]) == 0);
    CHECK(MXNDArrayCreate(d1, 1, 1, 0, 0, &args[1]) == 0);
    CHECK(MXNDArrayCreate(d1, 1, 1, 0, 0, &args[2]) == 0);
    CHECK(MXNDArraySyncCopyFromCPU(args[0], xs, 6) == 0);
    CHECK(MXNDArraySyncCopyFromCPU(args[1], s0, 2) == 0);
    CHECK(MXNDArraySyncCopyFromCPU(args[2], ws, 2) == 0);
    CHECK(MXExecutorBind(loop, 1, 0, 3, args, grads, grad_req, 0, NULL, &e) == 0);
    CHECK(MXExecutorForward(e, 0) == 0);
    CHECK(MXExecutorOutputs(e, &n_out, &outs) == 0 && n_out == 2);
    if (n_out == 2) {
      CHECK(MXNDArraySyncCopyToCPU(outs[0], got0, 6) == 0 && memcmp(got0, want0, sizeof want0) == 0);
      CHECK(MXNDArraySyncCopyToCPU(outs[1], got1, 2) == 0 && memcmp(got1, want1, sizeof want1) == 0);
      CHECK(MXNDArrayFree(outs[0]) == 0 && MXNDArrayFree(outs[1]) == 0);
    }
    CHECK(MXExecutorFree(e) == 0);
    for (i = 0; i < 3; i++) CHECK(MXNDArrayFree(args[i]) == 0);
  }

  /* The JSON keeps the loop body; it loads back to the same text. */
  {
    const char *json = NULL, *again = NULL;
    char first[8192];
    CHECK(MXSymbolSaveToJSON(loop, &json) == 0);
    CHECK(json != NULL && strstr(json, "\"subgraphs\"") != NULL && strlen(json) < sizeof first);
    if (json != NULL && strlen(json) < sizeof first) {
      strcpy(first, json);
      CHECK(MXSymbolCreateFromJSON(first, &reloaded) == 0);
      CHECK(MXSymbolSaveToJSON(reloaded, &again) == 0 && strcmp(first, again) == 0);
    }
  }

  /* Parameters that do not fit the body (5 arguments: 4 inputs, the body takes 3). */
  bad = foreach_op("5");
  {
    SymbolHandle args[5] = {body, data, init, w, w};
    CHECK(MXSymbolCompose(bad, "bad", 5, NULL, args) == -1);
    CHECK(starts_with(MXGetLastError(), "MXNetError") || starts_with(MXGetLastError(), "ValueError"));
  }

  CHECK(MXSymbolFree(bad) == 0);
  CHECK(MXSymbolFree(reloaded) == 0);
  CHECK(MXSymbolFree(loop) == 0);
  CHECK(MXSymbolFree(data) == 0 && MXSymbolFree(init) == 0 && MXSymbolFree(body) == 0);
  CHECK(MXSymbolFree(out) == 0 && MXSymbolFree(xw) == 0);
  CHECK(MXSymbolFree(x) == 0 && MXSymbolFree(s) == 0 && MXSymbolFree(w) == 0);
  if (failures == 0) printf("control_flow: all checks passed\n");
  return failures != 0;
}

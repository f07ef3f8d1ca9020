/* The public headers compile standalone, twice included, warning-free (see CMakeLists.txt for
 * the flags), and use the stock typedef names. Built as C99 and as C++11. */
#include <mxnet/c_api.h>
#include <mxnet/c_api.h>
#include <mxnet/c_api_test.h>
#include <mxnet/c_api_test.h>
#include <mxnet/mxnet_loader.h>
#include <mxnet/mxnet_loader.h>

/* Stock names the header must provide. */
static NDArrayHandle nd_handle;
static ContextHandle ctx_handle;
static EngineVarHandle var_handle;
static EngineFnPropertyHandle prop_handle;
static ProfileHandle profile_handle;
static SymbolHandle symbol_handle;
static CachedOpHandle cached_op_handle;
static KVStoreHandle kvstore_handle;
static mx_uint u = 1;
static mx_float f = 1.0f;
static dim_t d = 1;

int main(void) {
  struct LibFeature feature;
  int (*fns[])(void) = {MXNotifyShutdown};
  feature.name = "x";
  feature.enabled = 1;
  (void)fns;
  return (nd_handle == 0 && ctx_handle == 0 && var_handle == 0 && prop_handle == 0 &&
          profile_handle == 0 && symbol_handle == 0 && cached_op_handle == 0 &&
          kvstore_handle == 0 && u == 1 && f == 1.0f && d == 1 && feature.enabled &&
          MXNET_RT_ABI_VERSION == 10901)
             ? 0
             : 1;
}

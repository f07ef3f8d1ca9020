// mxnet-rt from C++: a small RAII-free wrapper that turns failures into exceptions, and a
// walk over the whole configuration registry.
#include <mxnet/c_api.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace {

// Throw the library's error text when a call fails.
void check(int rc) {
  if (rc != 0) throw std::runtime_error(MXGetLastError());
}

// Count the variables in MXGetConfig(NULL)'s JSON array (one "name" key per object).
size_t count_variables(const std::string& json) {
  size_t count = 0;
  for (size_t pos = json.find("\"name\":"); pos != std::string::npos;
       pos = json.find("\"name\":", pos + 1)) {
    ++count;
  }
  return count;
}

}  // namespace

int main() {
  try {
    int version = 0;
    check(MXGetVersion(&version));
    const char* json = nullptr;
    check(MXGetConfig(nullptr, &json));
    std::string all(json);
    std::printf("mxnet-rt implements MXNet %d; %zu configuration variables known\n", version,
                count_variables(all));

    check(MXSetNumOMPThreads(2));
    int threads = 0;
    check(MXGetNumOMPThreads(&threads));
    std::printf("kernel threads: %d\n", threads);

    try {
      check(MXGetConfig("MXNET_CPU_WORKER_NTHREAD", &json));
      std::fprintf(stderr, "an unknown name was accepted\n");
      return 1;
    } catch (const std::runtime_error& e) {
      std::printf("unknown name refused: %s\n", e.what());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::printf("demo_cpp: ok\n");
  return 0;
}

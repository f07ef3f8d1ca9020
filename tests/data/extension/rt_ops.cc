// An extension library for the MXLoadLib tests (tests/python/test_extension_lib.py), built
// against the lib_api.h and lib_api.cc that the stock mxnet 1.9.1 wheel ships:
//
//   g++ -shared -fPIC -std=c++11 -O2 -I<wheel>/include/mxnet rt_ops.cc <wheel>/src/lib_api.cc
//
// Operators (float32 and float64):
//   rt_scale_add(a, b, alpha=1)  out = alpha * a + b; backward da = alpha * dout, db = dout
//                                (through workspace memory from OpResource::alloc_cpu)
//   rt_max_scale(x)              stateful: y = x / max|x|, and the state keeps max|x| for the
//                                backward dx = dy / max|x|
//   rt_accumulate(acc, x)        out = 2 * x; writes acc += x (a mutated input)
//   rt_uniform_like(x)           out = x + u, u uniform in [0, 1) from the random states
//   rt_two_outputs(x)            outputs (x + 1, x * x)
// Errors come back through MX_ERROR_MSG (rt_scale_add on shapes that differ).
// Built with -DRT_WITH_PASS it also registers a graph pass, which mxnet-rt refuses.
#include <cmath>
#include <random>
#include <string>
#include "lib_api.h"

using namespace mxnet::ext;

namespace {

typedef std::unordered_map<std::string, std::string> Attrs;

bool float_type(int t) { return t == kFloat32 || t == kFloat64; }

template <typename T>
T at(MXTensor& t, int64_t i) { return t.data<T>()[i]; }

double get(MXTensor& t, int64_t i) {
  return t.dtype == kFloat32 ? static_cast<double>(at<float>(t, i)) : at<double>(t, i);
}

void put(MXTensor& t, int64_t i, double v) {
  if (t.dtype == kFloat32) t.data<float>()[i] = static_cast<float>(v);
  else t.data<double>()[i] = v;
}

double alpha_of(const Attrs& attrs) {
  auto it = attrs.find("alpha");
  return it == attrs.end() ? 1.0 : std::stod(it->second);
}

// Every input and output has input 0's type, which must be a float type.
MXReturnValue same_float_type(const Attrs&, std::vector<int>* in, std::vector<int>* out) {
  for (size_t i = 0; i < in->size(); i++) {
    if (!float_type(in->at(i)) || in->at(i) != in->at(0)) {
      MX_ERROR_MSG << "rt_ops: input " << i << " must be float32 or float64 like input 0";
      return MX_FAIL;
    }
  }
  for (size_t i = 0; i < out->size(); i++) out->at(i) = in->at(0);
  return MX_SUCCESS;
}

// Every output has input 0's shape.
MXReturnValue shape_of_first(const Attrs&, std::vector<std::vector<unsigned int>>* in,
                             std::vector<std::vector<unsigned int>>* out) {
  for (size_t i = 1; i < in->size(); i++) {
    if (in->at(i) != in->at(0)) {
      MX_ERROR_MSG << "rt_ops: input " << i << " has another shape than input 0";
      return MX_FAIL;
    }
  }
  for (size_t i = 0; i < out->size(); i++) out->at(i) = in->at(0);
  return MX_SUCCESS;
}

MXReturnValue two_in_one_out(const Attrs&, int* num_in, int* num_out) {
  *num_in = 2;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue one_in_one_out(const Attrs&, int* num_in, int* num_out) {
  *num_in = 1;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue one_in_two_out(const Attrs&, int* num_in, int* num_out) {
  *num_in = 1;
  *num_out = 2;
  return MX_SUCCESS;
}

// ---- rt_scale_add

MXReturnValue scale_add_forward(const Attrs& attrs, std::vector<MXTensor>* in,
                                std::vector<MXTensor>* out, const OpResource&) {
  double alpha = alpha_of(attrs);
  for (int64_t i = 0; i < out->at(0).size(); i++)
    put(out->at(0), i, alpha * get(in->at(0), i) + get(in->at(1), i));
  return MX_SUCCESS;
}

// inputs: dout, a, b, out; outputs: da, db
MXReturnValue scale_add_backward(const Attrs& attrs, std::vector<MXTensor>* in,
                                 std::vector<MXTensor>* out, const OpResource& res) {
  double alpha = alpha_of(attrs);
  int64_t n = in->at(0).size();
  // Stage the gradient in workspace memory, as a kernel with a temporary would.
  double* tmp = static_cast<double*>(res.alloc_cpu(static_cast<int>(n * sizeof(double))));
  if (tmp == nullptr) {
    MX_ERROR_MSG << "rt_scale_add: no workspace";
    return MX_FAIL;
  }
  for (int64_t i = 0; i < n; i++) tmp[i] = get(in->at(0), i);
  for (int64_t i = 0; i < n; i++) {
    put(out->at(0), i, alpha * tmp[i]);
    put(out->at(1), i, tmp[i]);
  }
  return MX_SUCCESS;
}

// ---- rt_max_scale (stateful)

class MaxScale : public CustomStatefulOp {
 public:
  MaxScale() : max_(0) {}
  MXReturnValue Forward(std::vector<MXTensor>* in, std::vector<MXTensor>* out,
                        const OpResource&) override {
    max_ = 0;
    for (int64_t i = 0; i < in->at(0).size(); i++) max_ = std::max(max_, std::fabs(get(in->at(0), i)));
    if (max_ == 0) {
      MX_ERROR_MSG << "rt_max_scale: the input is all zeros";
      return MX_FAIL;
    }
    for (int64_t i = 0; i < in->at(0).size(); i++) put(out->at(0), i, get(in->at(0), i) / max_);
    return MX_SUCCESS;
  }
  // inputs: dy, x, y; outputs: dx
  MXReturnValue Backward(std::vector<MXTensor>* in, std::vector<MXTensor>* out,
                         const OpResource&) override {
    for (int64_t i = 0; i < in->at(0).size(); i++) put(out->at(0), i, get(in->at(0), i) / max_);
    return MX_SUCCESS;
  }

 private:
  double max_;
};

MXReturnValue max_scale_create(const Attrs&, const MXContext&,
                               const std::vector<std::vector<unsigned int>>&,
                               const std::vector<int>, CustomStatefulOp** op) {
  *op = CustomStatefulOp::create<MaxScale>();
  return MX_SUCCESS;
}

// ---- rt_accumulate (mutates input 0)

MXReturnValue accumulate_forward(const Attrs&, std::vector<MXTensor>* in,
                                 std::vector<MXTensor>* out, const OpResource&) {
  for (int64_t i = 0; i < in->at(1).size(); i++) {
    put(in->at(0), i, get(in->at(0), i) + get(in->at(1), i));
    put(out->at(0), i, 2 * get(in->at(1), i));
  }
  return MX_SUCCESS;
}

MXReturnValue accumulate_mutates(const Attrs&, std::vector<int>* indices) {
  indices->push_back(0);
  return MX_SUCCESS;
}

// ---- rt_uniform_like

MXReturnValue uniform_forward(const Attrs&, std::vector<MXTensor>* in,
                              std::vector<MXTensor>* out, const OpResource& res) {
  mx_cpu_rand_t* states = res.get_cpu_rand_states();
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < in->at(0).size(); i++)
    put(out->at(0), i, get(in->at(0), i) + u(states[i % MX_NUM_CPU_RANDOM_STATES]));
  return MX_SUCCESS;
}

// ---- rt_two_outputs

MXReturnValue two_outputs_forward(const Attrs&, std::vector<MXTensor>* in,
                                  std::vector<MXTensor>* out, const OpResource&) {
  for (int64_t i = 0; i < in->at(0).size(); i++) {
    double x = get(in->at(0), i);
    put(out->at(0), i, x + 1);
    put(out->at(1), i, x * x);
  }
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(rt_scale_add)
.setParseAttrs(two_in_one_out)
.setInferType(same_float_type)
.setInferShape(shape_of_first)
.setForward(scale_add_forward, "cpu")
.setBackward(scale_add_backward, "cpu");

REGISTER_OP(rt_max_scale)
.setParseAttrs(one_in_one_out)
.setInferType(same_float_type)
.setInferShape(shape_of_first)
.setCreateOpState(max_scale_create, "cpu");

REGISTER_OP(rt_accumulate)
.setParseAttrs(two_in_one_out)
.setInferType(same_float_type)
.setInferShape(shape_of_first)
.setMutateInputs(accumulate_mutates)
.setForward(accumulate_forward, "cpu");

REGISTER_OP(rt_uniform_like)
.setParseAttrs(one_in_one_out)
.setInferType(same_float_type)
.setInferShape(shape_of_first)
.setForward(uniform_forward, "cpu");

REGISTER_OP(rt_two_outputs)
.setParseAttrs(one_in_two_out)
.setInferType(same_float_type)
.setInferShape(shape_of_first)
.setForward(two_outputs_forward, "cpu");

#ifdef RT_WITH_PASS
MXReturnValue identity_pass(mxnet::ext::Graph*, const Attrs&) { return MX_SUCCESS; }
REGISTER_PASS(rt_identity_pass).setBody(identity_pass);
#endif

MXReturnValue initialize(int version) {
  if (version < 10900) {
    MX_ERROR_MSG << "rt_ops needs MXNet 1.9 or later, not " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}

// The TVM backend (a plugin: libmodelyard_tvm.so): an exported Relax .so in TVM's VM, on the CPU.
// C++ inside, the C backend interface of internal.h outside; every exception becomes a status.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

extern "C" {
#include "internal.h"
}

namespace {

namespace ffi = tvm::ffi;

struct CpuAlloc {
  void AllocData(DLTensor* t) { t->data = std::aligned_alloc(64, (ffi::GetDataSize(*t) + 63) / 64 * 64 + 64); }
  void FreeData(DLTensor* t) { std::free(t->data); }
};

struct State {
  ffi::Module vm;
  ffi::Function main;
  std::vector<const my_tensor_t*> inputs, outputs;
};

uint64_t now_ns() {  // the plugin keeps to itself: it links no symbol of libmodelyard
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count());
}

DLDataType dl_type(modelyard_dtype_t d) {
  switch (d) {
    case MODELYARD_FLOAT32: return {kDLFloat, 32, 1};
    case MODELYARD_FLOAT16: return {kDLFloat, 16, 1};
    case MODELYARD_FLOAT64: return {kDLFloat, 64, 1};
    case MODELYARD_INT8: return {kDLInt, 8, 1};
    case MODELYARD_UINT8: return {kDLUInt, 8, 1};
    case MODELYARD_INT16: return {kDLInt, 16, 1};
    case MODELYARD_UINT16: return {kDLUInt, 16, 1};
    case MODELYARD_INT32: return {kDLInt, 32, 1};
    case MODELYARD_UINT32: return {kDLUInt, 32, 1};
    case MODELYARD_INT64: return {kDLInt, 64, 1};
    case MODELYARD_UINT64: return {kDLUInt, 64, 1};
    case MODELYARD_BOOL: return {kDLBool, 8, 1};
  }
  return {kDLFloat, 32, 1};
}

modelyard_status_t load(const my_load_args_t* a, void** out_state, char* err) {
  try {
    // TVM loads a shared object from a path: the bytes were checked (sha256) from the same file
    ffi::Module lib = ffi::Module::LoadFromFile(a->path);
    auto load_exec = lib->GetFunction("vm_load_executable", true);
    if (!load_exec.has_value()) {
      std::snprintf(err, MY_ERR_SIZE, "%s is not a Relax VM executable (no vm_load_executable)", a->path);
      return MODELYARD_INCOMPATIBLE;
    }
    ffi::Module vm = (*load_exec)().cast<ffi::Module>();
    auto init = vm->GetFunction("vm_initialization", true);
    const int kPooled = 2;
    (*init)(static_cast<int>(kDLCPU), 0, kPooled, static_cast<int>(kDLCPU), 0, kPooled);
    auto main = vm->GetFunction(a->entry, true);
    if (!main.has_value()) {
      std::snprintf(err, MY_ERR_SIZE, "the executable has no function %s", a->entry);
      return MODELYARD_NOT_FOUND;
    }
    auto* s = new State{vm, *main, {}, {}};
    for (size_t i = 0; i < a->n_inputs; i++) s->inputs.push_back(&a->inputs[i]);
    for (size_t i = 0; i < a->n_outputs; i++) s->outputs.push_back(&a->outputs[i]);
    *out_state = s;
    return MODELYARD_OK;
  } catch (const std::exception& e) {
    std::snprintf(err, MY_ERR_SIZE, "TVM: %s", e.what());
    return MODELYARD_RUNTIME_ERROR;
  }
}

modelyard_status_t run(void* opaque, const void* const* inputs, void* const* outputs,
                       modelyard_timing_t* timing, char* err) {
  auto* s = static_cast<State*>(opaque);
  try {
    uint64_t t0 = now_ns();
    std::vector<ffi::Any> args;
    for (size_t i = 0; i < s->inputs.size(); i++) {
      const modelyard_tensor_info_t& info = s->inputs[i]->info;
      std::vector<int64_t> shape(info.shape, info.shape + info.rank);
      ffi::Tensor t = ffi::Tensor::FromNDAlloc(CpuAlloc(), ffi::ShapeView(shape.data(), shape.size()),
                                               dl_type(info.dtype), DLDevice{kDLCPU, 0});
      std::memcpy(t.data_ptr(), inputs[i], info.byte_size);
      args.emplace_back(t);
    }
    std::vector<ffi::AnyView> views(args.begin(), args.end());
    uint64_t t1 = now_ns();
    ffi::Any result;
    s->main.CallPacked(views.data(), static_cast<int32_t>(views.size()), &result);
    uint64_t t2 = now_ns();
    std::vector<ffi::Tensor> outs;
    if (auto t = result.as<ffi::Tensor>()) {
      outs.push_back(*t);
    } else {
      for (const ffi::Any& item : result.cast<ffi::Array<ffi::Any>>()) outs.push_back(item.cast<ffi::Tensor>());
    }
    if (outs.size() != s->outputs.size()) {
      std::snprintf(err, MY_ERR_SIZE, "%zu outputs, release.json's io says %zu", outs.size(), s->outputs.size());
      return MODELYARD_CORRUPT;
    }
    for (size_t k = 0; k < outs.size(); k++) {
      size_t bytes = ffi::GetDataSize(*outs[k].GetDLTensorPtr());
      if (bytes != s->outputs[k]->info.byte_size || !outs[k].IsContiguous()) {
        std::snprintf(err, MY_ERR_SIZE, "output %zu (%s) has %zu bytes, release.json's io says %zu", k,
                      s->outputs[k]->info.name, bytes, s->outputs[k]->info.byte_size);
        return MODELYARD_CORRUPT;
      }
      std::memcpy(outputs[k], static_cast<char*>(outs[k].data_ptr()) + outs[k].byte_offset(), bytes);
    }
    uint64_t t3 = now_ns();
    timing->copy_in_ns = t1 - t0;
    timing->invoke_ns = t2 - t1;
    timing->copy_out_ns = t3 - t2;
    return MODELYARD_OK;
  } catch (const std::exception& e) {
    std::snprintf(err, MY_ERR_SIZE, "TVM: %s", e.what());
    return MODELYARD_RUNTIME_ERROR;
  }
}

void destroy(void* opaque) { delete static_cast<State*>(opaque); }

const my_backend_ops_t OPS = {"tvm", load, run, destroy};

}  // namespace

extern "C" __attribute__((visibility("default"))) const my_backend_ops_t* modelyard_tvm_backend(void) {
  return &OPS;
}

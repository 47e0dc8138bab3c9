/* Internal to libmodelyard: the backend interface and small helpers. */
#ifndef MODELYARD_INTERNAL_H_
#define MODELYARD_INTERNAL_H_

#include <stddef.h>
#include <stdint.h>

#include "modelyard.h"

#define MY_ERR_SIZE 2048

typedef struct my_tensor_s {
  modelyard_tensor_info_t info;
  size_t elem_size;
} my_tensor_t;

typedef struct my_load_args_s {
  const char* path;            /* the artifact file */
  const void* bytes;           /* its contents (already read and checked), size below */
  size_t size;
  const char* entry;           /* the entry function, e.g. "main" */
  const char* device;          /* IREE: "local-task", "local-sync", "vulkan"; TVM: "cpu" */
  int threads;                 /* CPU worker threads (options.cpu_threads); 0: the default */
  size_t n_inputs, n_outputs;
  const my_tensor_t* inputs;
  const my_tensor_t* outputs;
} my_load_args_t;

/* One implementation per backend: IREE (backend_iree.c), TVM (backend_tvm.cc, a plugin). */
typedef struct my_backend_ops_s {
  const char* name;
  /* On failure: a status, and a message written into err (MY_ERR_SIZE bytes). */
  modelyard_status_t (*load)(const my_load_args_t* args, void** out_state, char* err);
  /* inputs[i] / outputs[k]: host memory of exactly the tensors' byte sizes. */
  modelyard_status_t (*run)(void* state, const void* const* inputs, void* const* outputs,
                            modelyard_timing_t* timing, char* err);
  void (*destroy)(void* state);
} my_backend_ops_t;

const my_backend_ops_t* my_iree_backend(void);
/* The Vulkan device IREE's driver would use, as its own snapshot describes it. */
#define MY_VK_MAX_FEATURES 24
typedef struct my_vk_device_s {
  char name[256];
  char describe[512];             /* "llvmpipe (...) (Vulkan 1.3.230, cpu, driver llvmpipe)" */
  uint32_t api_version;           /* VK_MAKE_API_VERSION */
  int software;                   /* VK_PHYSICAL_DEVICE_TYPE_CPU: a software rasterizer */
  uint32_t subgroup_size, min_subgroup_size, max_subgroup_size, subgroup_operations;
  uint32_t max_workgroup_invocations, max_workgroup_memory_bytes;
  struct { const char* name; int on; } features[MY_VK_MAX_FEATURES];
  size_t n_features;
} my_vk_device_t;
/* 1 with *out filled, else 0 with why not (no loader, no device at IREE's HAL baseline). */
int my_iree_vulkan_device(my_vk_device_t* out, char* why, size_t why_size);

/* The TVM plugin (libmodelyard_tvm.so) exports this symbol. */
typedef const my_backend_ops_t* (*my_tvm_entry_fn)(void);
#define MY_TVM_ENTRY "modelyard_tvm_backend"

/* errors.c: set the calling thread's last error (returns status) / clear it. */
modelyard_status_t my_fail(modelyard_status_t status, const char* fmt, ...);
void my_clear_error(void);

void my_sha256_hex(const void* data, size_t size, char out_hex[65]);
uint64_t my_now_ns(void);

#endif

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
/* Probes the Vulkan devices through IREE's driver: 1 with the first device's name, 0 with why not. */
int my_iree_vulkan_device(char* name, size_t name_size, char* why, size_t why_size);

/* The TVM plugin (libmodelyard_tvm.so) exports this symbol. */
typedef const my_backend_ops_t* (*my_tvm_entry_fn)(void);
#define MY_TVM_ENTRY "modelyard_tvm_backend"

void my_sha256_hex(const void* data, size_t size, char out_hex[65]);
uint64_t my_now_ns(void);

#endif

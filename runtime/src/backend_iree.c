/* The IREE backend: a .vmfb on a HAL device (local-task / local-sync CPU, or Vulkan). */
#define _GNU_SOURCE  /* sched_getaffinity, CPU_COUNT */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "iree/base/tooling/flags.h"
#include "iree/hal/api.h"
#if MODELYARD_VULKAN
#include "iree/hal/drivers/vulkan/api.h"
#include "iree/hal/drivers/vulkan/physical_device.h"
#include "iree/hal/drivers/vulkan/physical_device_selection.h"
#include "iree/hal/drivers/vulkan/util/libvulkan.h"
#endif
#include "iree/runtime/call.h"
#include "iree/runtime/instance.h"
#include "iree/runtime/session.h"

typedef struct iree_state_s {
  iree_runtime_instance_t* instance;
  iree_hal_device_t* device;
  iree_runtime_session_t* session;
  iree_runtime_call_t call;
  int call_ready;
  void* contents;  /* the module's bytes (64-byte aligned copy), owned here */
  size_t n_inputs, n_outputs;
  const my_tensor_t* inputs;
  const my_tensor_t* outputs;
  int device_locked;  /* load() holds device_lock (released on every way out) */
} iree_state_t;

static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;

static modelyard_status_t from_iree(iree_status_t status, const char* what, char* err) {
  iree_status_code_t code = iree_status_code(status);
  char text[MY_ERR_SIZE - 200];
  iree_host_size_t length = 0;
  modelyard_status_t out;
  if (iree_status_format(status, sizeof(text), text, &length)) {
    snprintf(err, MY_ERR_SIZE, "%s: %.*s", what, (int)length, text);
  } else {
    snprintf(err, MY_ERR_SIZE, "%s: %s", what, iree_status_code_string(code));
  }
  iree_status_free(status);
  switch (code) {
    case IREE_STATUS_NOT_FOUND: out = MODELYARD_NOT_FOUND; break;
    case IREE_STATUS_UNAVAILABLE: out = MODELYARD_UNAVAILABLE; break;
    case IREE_STATUS_RESOURCE_EXHAUSTED: out = MODELYARD_OUT_OF_MEMORY; break;
    case IREE_STATUS_INCOMPATIBLE: out = MODELYARD_INCOMPATIBLE; break;
    case IREE_STATUS_INVALID_ARGUMENT:
    case IREE_STATUS_FAILED_PRECONDITION: out = MODELYARD_INVALID_ARGUMENT; break;
    default: out = MODELYARD_RUNTIME_ERROR; break;
  }
  return out;
}

static iree_hal_element_type_t element_type(modelyard_dtype_t dtype) {
  switch (dtype) {
    case MODELYARD_FLOAT32: return IREE_HAL_ELEMENT_TYPE_FLOAT_32;
    case MODELYARD_FLOAT16: return IREE_HAL_ELEMENT_TYPE_FLOAT_16;
    case MODELYARD_FLOAT64: return IREE_HAL_ELEMENT_TYPE_FLOAT_64;
    case MODELYARD_INT8: return IREE_HAL_ELEMENT_TYPE_SINT_8;
    case MODELYARD_UINT8: return IREE_HAL_ELEMENT_TYPE_UINT_8;
    case MODELYARD_INT16: return IREE_HAL_ELEMENT_TYPE_SINT_16;
    case MODELYARD_UINT16: return IREE_HAL_ELEMENT_TYPE_UINT_16;
    case MODELYARD_INT32: return IREE_HAL_ELEMENT_TYPE_SINT_32;
    case MODELYARD_UINT32: return IREE_HAL_ELEMENT_TYPE_UINT_32;
    case MODELYARD_INT64: return IREE_HAL_ELEMENT_TYPE_SINT_64;
    case MODELYARD_UINT64: return IREE_HAL_ELEMENT_TYPE_UINT_64;
    case MODELYARD_BOOL: return IREE_HAL_ELEMENT_TYPE_BOOL_8;
  }
  return IREE_HAL_ELEMENT_TYPE_NONE;
}

/* Whether an output IREE returns as `got` holds the bytes of the declared `want`: the same type,
 * or integers (booleans included) of the same width. IREE's integers are signless: a uint8 output
 * comes back as int8 with the same bytes, and is read as the declared dtype, as
 * pipeline/stages/validate.py and pipeline/app/runner.py do. */
static int same_bytes(iree_hal_element_type_t got, iree_hal_element_type_t want) {
  return got == want || (iree_hal_element_numerical_type_is_integer(got) &&
                         iree_hal_element_numerical_type_is_integer(want) &&
                         iree_hal_element_bit_count(got) == iree_hal_element_bit_count(want));
}

static int usable_cpus(void) {
  cpu_set_t set;
  int n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

static void destroy(void* opaque) {
  iree_state_t* s = (iree_state_t*)opaque;
  if (!s) return;
  if (s->device_locked) pthread_mutex_unlock(&device_lock);
  if (s->call_ready) iree_runtime_call_deinitialize(&s->call);
  iree_runtime_session_release(s->session);
  iree_hal_device_release(s->device);
  iree_runtime_instance_release(s->instance);
  free(s->contents);
  free(s);
}

#define TRY(expr, what)                                       \
  do {                                                        \
    iree_status_t st_ = (expr);                               \
    if (!iree_status_is_ok(st_)) {                            \
      modelyard_status_t out_ = from_iree(st_, (what), err);  \
      destroy(s);                                             \
      return out_;                                            \
    }                                                         \
  } while (0)

static modelyard_status_t load(const my_load_args_t* a, void** out_state, char* err) {
  iree_state_t* s = (iree_state_t*)calloc(1, sizeof(*s));
  iree_runtime_instance_options_t iopts;
  iree_runtime_session_options_t sopts;
  iree_vm_context_t* context;
  iree_vm_module_t* module;
  iree_vm_function_t function;
  void* copy = NULL;
  if (!s) return MODELYARD_OUT_OF_MEMORY;
  s->n_inputs = a->n_inputs; s->n_outputs = a->n_outputs;
  s->inputs = a->inputs; s->outputs = a->outputs;
  /* IREE's flags are process-wide: one thread at a time sets the worker count and creates the
   * device that reads it (modelyard_open may run in several threads) */
  pthread_mutex_lock(&device_lock);
  s->device_locked = 1;
  if (strcmp(a->device, "local-task") == 0) {
    /* The worker count, always explicit (IREE's process-wide flags, read when the local-task
     * driver makes its executor; iree.runtime.flags.parse_flags in Python): the caller's, else
     * one per usable CPU, like `doit bench` (pipeline/run/timing.py). IREE's own default
     * (--task_topology_mode=physical_cores) pins each worker to a core: on a loaded 2-core
     * machine that made ppocr_cls 1.4x slower than these unpinned workers (docs/runtime.md). */
    char flag[64], program[] = "modelyard";
    char* argv[] = {program, flag, NULL};
    char** pargv = argv;
    int argc = 2;
    snprintf(flag, sizeof(flag), "--task_topology_group_count=%d", a->threads > 1 ? a->threads : usable_cpus());
    TRY(iree_flags_parse(IREE_FLAGS_PARSE_MODE_DEFAULT, &argc, &pargv), "setting the worker count");
  }
  iree_runtime_instance_options_initialize(&iopts);
  iree_runtime_instance_options_use_all_available_drivers(&iopts);
  TRY(iree_runtime_instance_create(&iopts, iree_allocator_system(), &s->instance),
      "creating the IREE runtime instance");
  {
    char what[128];
    snprintf(what, sizeof(what), "creating the IREE HAL device %s", a->device);
    TRY(iree_runtime_instance_try_create_default_device(s->instance, iree_make_cstring_view(a->device),
                                                        &s->device), what);
  }
  s->device_locked = 0;
  pthread_mutex_unlock(&device_lock);
  iree_runtime_session_options_initialize(&sopts);
  TRY(iree_runtime_session_create_with_device(s->instance, &sopts, s->device,
                                              iree_runtime_instance_host_allocator(s->instance),
                                              &s->session), "creating the IREE session");
  /* the flatbuffer wants an aligned buffer of its own; the session frees it with the module */
  if (posix_memalign(&copy, 64, a->size ? a->size : 1) != 0) { destroy(s); return MODELYARD_OUT_OF_MEMORY; }
  memcpy(copy, a->bytes, a->size);
  s->contents = copy;  /* freed by destroy(), after the session that reads it */
  TRY(iree_runtime_session_append_bytecode_module_from_memory(
          s->session, iree_make_const_byte_span(copy, a->size), iree_allocator_null()),
      "loading the module");
  context = iree_runtime_session_context(s->session);
  module = iree_vm_context_module_at(context, iree_vm_context_module_count(context) - 1);
  {
    iree_status_t st = iree_vm_module_lookup_function_by_name(
        module, IREE_VM_FUNCTION_LINKAGE_EXPORT, iree_make_cstring_view(a->entry), &function);
    if (!iree_status_is_ok(st)) {
      iree_string_view_t name = iree_vm_module_name(module);
      iree_status_free(st);
      snprintf(err, MY_ERR_SIZE, "the module %.*s has no exported function %s",
               (int)name.size, name.data, a->entry);
      destroy(s);
      return MODELYARD_NOT_FOUND;
    }
  }
  TRY(iree_runtime_call_initialize(s->session, function, &s->call), "preparing the call");
  s->call_ready = 1;
  *out_state = s;
  return MODELYARD_OK;
}

static modelyard_status_t run(void* opaque, const void* const* inputs, void* const* outputs,
                              modelyard_timing_t* timing, char* err) {
  iree_state_t* s = (iree_state_t*)opaque;
  iree_hal_allocator_t* allocator = iree_runtime_session_device_allocator(s->session);
  size_t i;
  uint64_t t0, t1, t2, t3;
  iree_status_t st = iree_ok_status();
  iree_runtime_call_reset(&s->call);
  t0 = my_now_ns();
  for (i = 0; i < s->n_inputs && iree_status_is_ok(st); i++) {
    const modelyard_tensor_info_t* info = &s->inputs[i].info;
    iree_hal_dim_t shape[MODELYARD_MAX_RANK];
    iree_hal_buffer_view_t* view = NULL;
    iree_hal_buffer_params_t params = {0};
    int d;
    for (d = 0; d < info->rank; d++) shape[d] = (iree_hal_dim_t)info->shape[d];
    params.type = IREE_HAL_MEMORY_TYPE_DEVICE_LOCAL;
    params.usage = IREE_HAL_BUFFER_USAGE_DEFAULT;
    st = iree_hal_buffer_view_allocate_buffer_copy(
        s->device, allocator, (iree_host_size_t)info->rank, shape, element_type(info->dtype),
        IREE_HAL_ENCODING_TYPE_DENSE_ROW_MAJOR, params,
        iree_make_const_byte_span(inputs[i], info->byte_size), &view);
    if (iree_status_is_ok(st)) st = iree_runtime_call_inputs_push_back_buffer_view(&s->call, view);
    iree_hal_buffer_view_release(view);
  }
  if (!iree_status_is_ok(st)) return from_iree(st, "uploading the inputs", err);
  t1 = my_now_ns();
  st = iree_runtime_call_invoke(&s->call, 0);
  t2 = my_now_ns();
  if (!iree_status_is_ok(st)) return from_iree(st, "invoking the entry function", err);
  for (i = 0; i < s->n_outputs && iree_status_is_ok(st); i++) {
    iree_hal_buffer_view_t* view = NULL;
    st = iree_runtime_call_outputs_pop_front_buffer_view(&s->call, &view);
    if (!iree_status_is_ok(st)) break;
    if (!same_bytes(iree_hal_buffer_view_element_type(view), element_type(s->outputs[i].info.dtype))) {
      snprintf(err, MY_ERR_SIZE, "output %zu (%s) comes back as IREE element type 0x%08x, "
               "release.json's io says %s (rebuild the artifact, or fix the release's io)", i,
               s->outputs[i].info.name, (unsigned)iree_hal_buffer_view_element_type(view),
               s->outputs[i].info.dtype_name);
      iree_hal_buffer_view_release(view);
      return MODELYARD_CORRUPT;
    }
    if (iree_hal_buffer_view_byte_length(view) != s->outputs[i].info.byte_size) {
      snprintf(err, MY_ERR_SIZE, "output %zu (%s) has %zu bytes, release.json's io says %zu",
               i, s->outputs[i].info.name, (size_t)iree_hal_buffer_view_byte_length(view),
               s->outputs[i].info.byte_size);
      iree_hal_buffer_view_release(view);
      return MODELYARD_CORRUPT;
    }
    st = iree_hal_device_transfer_d2h(s->device, iree_hal_buffer_view_buffer(view), 0, outputs[i],
                                      s->outputs[i].info.byte_size,
                                      IREE_HAL_TRANSFER_BUFFER_FLAG_DEFAULT, iree_infinite_timeout());
    iree_hal_buffer_view_release(view);
  }
  if (!iree_status_is_ok(st)) return from_iree(st, "reading the outputs back", err);
  t3 = my_now_ns();
  timing->copy_in_ns = t1 - t0;
  timing->invoke_ns = t2 - t1;
  timing->copy_out_ns = t3 - t2;
  return MODELYARD_OK;
}

static const my_backend_ops_t OPS = {"iree", load, run, destroy};

const my_backend_ops_t* my_iree_backend(void) { return &OPS; }

#if MODELYARD_VULKAN
/* The Vulkan device IREE's driver would create ("vulkan", the default selector: the first
 * device at IREE's HAL baseline), described from the driver's own snapshot of it: what
 * modelyard.c compares with an artifact's recorded requirements. */
int my_iree_vulkan_device(my_vk_device_t* out, char* why, size_t why_size) {
  iree_allocator_t host = iree_allocator_system();
  iree_hal_vulkan_libvulkan_t libvulkan;
  iree_hal_vulkan_driver_options_t options;
  iree_hal_vulkan_physical_device_selector_t selector;
  iree_hal_vulkan_instance_t instance;
  iree_hal_vulkan_physical_device_snapshot_t snap;
  iree_status_t st;
  memset(out, 0, sizeof(*out));
  memset(&libvulkan, 0, sizeof(libvulkan));
  memset(&selector, 0, sizeof(selector));
  selector.mode = IREE_HAL_VULKAN_PHYSICAL_DEVICE_SELECTOR_DEFAULT;
  iree_hal_vulkan_driver_options_initialize(&options);
  st = iree_hal_vulkan_libvulkan_initialize(IREE_HAL_VULKAN_LIBVULKAN_FLAG_NONE,
                                            options.libvulkan_search_paths, host, &libvulkan);
  if (!iree_status_is_ok(st)) {
    snprintf(why, why_size, "no Vulkan loader here (libvulkan.so.1: install the Vulkan loader "
             "and a driver, or use a CPU artifact)");
    iree_status_free(st);
    return 0;
  }
  st = iree_hal_vulkan_physical_device_select(&libvulkan, &options, &selector, host, &instance, &snap);
  if (!iree_status_is_ok(st)) {
    char text[600];
    iree_host_size_t length = 0;
    if (!iree_status_format(st, sizeof(text), text, &length)) length = 0;
    snprintf(why, why_size, "no Vulkan device at IREE's HAL baseline (Vulkan 1.3, timeline "
             "semaphores, scalar block layout, synchronization2, a compute queue): %.*s",
             (int)length, text);
    iree_status_free(st);
    iree_hal_vulkan_libvulkan_deinitialize(&libvulkan);
    return 0;
  }
  {
    const VkPhysicalDeviceProperties* p = &snap.properties2.properties;
    const VkPhysicalDeviceFeatures* f = &snap.features2.features;
    static const char* types[] = {"other", "integrated GPU", "discrete GPU", "virtual GPU", "cpu"};
    struct { const char* name; VkBool32 on; } table[] = {
        {"shaderFloat16", snap.features12.shaderFloat16}, {"shaderInt8", snap.features12.shaderInt8},
        {"shaderInt16", f->shaderInt16}, {"shaderInt64", f->shaderInt64},
        {"shaderFloat64", f->shaderFloat64},
        {"storageBuffer16BitAccess", snap.features11.storageBuffer16BitAccess},
        {"storageBuffer8BitAccess", snap.features12.storageBuffer8BitAccess},
        {"bufferDeviceAddress", snap.features12.bufferDeviceAddress},
        {"timelineSemaphore", snap.features12.timelineSemaphore},
        {"scalarBlockLayout", snap.features12.scalarBlockLayout},
        {"synchronization2", snap.features13.synchronization2},
        {"shaderIntegerDotProduct", snap.features13.shaderIntegerDotProduct},
        {"subgroupSizeControl", snap.features13.subgroupSizeControl},
        {"variablePointers", snap.features11.variablePointers},
        {"cooperativeMatrix", snap.cooperative_matrix_features.cooperativeMatrix}};
    size_t i;
    snprintf(out->name, sizeof(out->name), "%s", p->deviceName);
    out->api_version = p->apiVersion;
    out->software = p->deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
    snprintf(out->describe, sizeof(out->describe), "%s (Vulkan %u.%u.%u, %s, driver %s)",
             p->deviceName, VK_API_VERSION_MAJOR(p->apiVersion), VK_API_VERSION_MINOR(p->apiVersion),
             VK_API_VERSION_PATCH(p->apiVersion),
             (unsigned)p->deviceType < 5 ? types[p->deviceType] : "other",
             snap.driver_properties.driverName[0] ? snap.driver_properties.driverName : "?");
    out->subgroup_size = snap.subgroup_properties.subgroupSize;
    out->subgroup_operations = snap.subgroup_properties.supportedOperations;
    out->min_subgroup_size = snap.subgroup_size_control_properties.minSubgroupSize;
    out->max_subgroup_size = snap.subgroup_size_control_properties.maxSubgroupSize;
    out->max_workgroup_invocations = p->limits.maxComputeWorkGroupInvocations;
    out->max_workgroup_memory_bytes = p->limits.maxComputeSharedMemorySize;
    for (i = 0; i < sizeof(table) / sizeof(table[0]) && i < MY_VK_MAX_FEATURES; i++) {
      out->features[i].name = table[i].name;
      out->features[i].on = table[i].on == VK_TRUE;
    }
    out->n_features = i;
  }
  iree_hal_vulkan_physical_device_snapshot_deinitialize(host, &snap);
  iree_hal_vulkan_instance_deinitialize(&instance);
  iree_hal_vulkan_libvulkan_deinitialize(&libvulkan);
  return 1;
}
#else
int my_iree_vulkan_device(my_vk_device_t* out, char* why, size_t why_size) {
  memset(out, 0, sizeof(*out));
  snprintf(why, why_size, "this runtime was built without Vulkan (MODELYARD_VULKAN=OFF)");
  return 0;
}
#endif

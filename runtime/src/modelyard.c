/* libmodelyard: release.json -> the artifact this device runs -> a backend. See modelyard.h.
 * C11 (_Thread_local) with POSIX threads and dlopen; no compiler extension. */
#define _GNU_SOURCE  /* dladdr */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cJSON.h"
#include "internal.h"

#define VK_MAKE_API(major, minor) (((uint32_t)(major) << 22) | ((uint32_t)(minor) << 12))
#define VK_MAJOR(version) (((uint32_t)(version) >> 22) & 0x7Fu)
#define VK_MINOR(version) (((uint32_t)(version) >> 12) & 0x3FFu)

#if defined(__aarch64__)
#define MY_ARCH "aarch64"
#elif defined(__x86_64__)
#define MY_ARCH "x86_64"
#else
#error "modelyard: an architecture it has no artifacts for"
#endif

struct modelyard_model_s {
  char abi[128];
  char backend_name[8];
  char* explain;
  size_t n_inputs, n_outputs;
  my_tensor_t* inputs;
  my_tensor_t* outputs;
  void** input_data;
  void** output_data;
  const my_backend_ops_t* ops;
  void* state;
  void* plugin;  /* dlopen handle of libmodelyard_tvm.so */
  int ran;                /* 1 after a successful run, 0 after a failed one */
  modelyard_timing_t timing;
  pthread_mutex_t lock;   /* serialises the calls that touch the buffers (modelyard.h: Threads) */
};

/* The sizes of modelyard_options_t that headers of this library's versions had (0.1.0: the
 * first); a newer layout appends its size here and reads only what a caller's size holds. */
static const size_t OPTIONS_SIZES[] = {sizeof(modelyard_options_t)};


uint64_t my_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

const char* modelyard_iree_commit(void) { return MODELYARD_IREE_COMMIT; }
int modelyard_iree_hal_version(void) { return MODELYARD_IREE_HAL_VERSION; }
const char* modelyard_version(void) { return MODELYARD_VERSION_STRING; }

static int known_options_size(size_t size) {
  size_t k;
  for (k = 0; k < sizeof(OPTIONS_SIZES) / sizeof(OPTIONS_SIZES[0]); k++)
    if (OPTIONS_SIZES[k] == size) return 1;
  return 0;
}

static modelyard_status_t unknown_options_size(const char* where, size_t size) {
  return my_fail(MODELYARD_INVALID_ARGUMENT, "%s: options struct_size is %zu, libmodelyard %s knows %zu "
              "(initialise the options with modelyard_default_options; a header newer than the "
              "library needs a newer library)", where, size, MODELYARD_VERSION_STRING,
              sizeof(modelyard_options_t));
}

modelyard_status_t modelyard_options_init(modelyard_options_t* o, size_t struct_size) {
  modelyard_options_t defaults;
  if (!o) return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_options_init: NULL options");
  if (!known_options_size(struct_size)) return unknown_options_size("modelyard_options_init", struct_size);
  memset(&defaults, 0, sizeof(defaults));
  defaults.struct_size = struct_size;
  defaults.verify_sha256 = 1;
  memcpy(o, &defaults, struct_size);
  return MODELYARD_OK;
}

/* ------------------------------------------------------------------------------ files, JSON */
static void* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  char* data;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return NULL;
  }
  data = (char*)malloc((size_t)n + 1);
  if (data && fread(data, 1, (size_t)n, f) != (size_t)n) { free(data); data = NULL; }
  fclose(f);
  if (data) { data[n] = 0; *size = (size_t)n; }
  return data;
}

static const char* str(const cJSON* obj, const char* key) {
  const cJSON* item = cJSON_GetObjectItemCaseSensitive(obj, key);
  return cJSON_IsString(item) ? item->valuestring : NULL;
}

static const struct { const char* name; modelyard_dtype_t dtype; size_t size; } DTYPES[] = {
    {"float32", MODELYARD_FLOAT32, 4}, {"float16", MODELYARD_FLOAT16, 2},
    {"float64", MODELYARD_FLOAT64, 8}, {"int8", MODELYARD_INT8, 1}, {"uint8", MODELYARD_UINT8, 1},
    {"int16", MODELYARD_INT16, 2}, {"uint16", MODELYARD_UINT16, 2}, {"int32", MODELYARD_INT32, 4},
    {"uint32", MODELYARD_UINT32, 4}, {"int64", MODELYARD_INT64, 8}, {"uint64", MODELYARD_UINT64, 8},
    {"bool", MODELYARD_BOOL, 1}};

static void free_tensors(my_tensor_t* t, size_t n) {
  size_t i;
  for (i = 0; t && i < n; i++) free((char*)t[i].info.name);
  free(t);
}

static modelyard_status_t parse_tensors(const cJSON* list, const char* what, my_tensor_t** out,
                                        size_t* count) {
  size_t n = (size_t)cJSON_GetArraySize(list), i;
  my_tensor_t* t;
  if (!cJSON_IsArray(list) || n == 0)
    return my_fail(MODELYARD_CORRUPT, "release.json: the model's io.%s is not a list of tensors", what);
  t = (my_tensor_t*)calloc(n, sizeof(*t));
  if (!t) return my_fail(MODELYARD_OUT_OF_MEMORY, "out of memory");
  for (i = 0; i < n; i++) {
    const cJSON* item = cJSON_GetArrayItem(list, (int)i);
    const cJSON* shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const char* dtype = str(item, "dtype");
    size_t k, elems = 1;
    int d;
    t[i].info.name = str(item, "name") ? strdup(str(item, "name")) : NULL;
    for (k = 0; dtype && k < sizeof(DTYPES) / sizeof(DTYPES[0]); k++)
      if (strcmp(dtype, DTYPES[k].name) == 0) {
        t[i].info.dtype = DTYPES[k].dtype;
        t[i].info.dtype_name = DTYPES[k].name;
        t[i].elem_size = DTYPES[k].size;
      }
    t[i].info.rank = cJSON_GetArraySize(shape);
    if (!t[i].info.name || !t[i].elem_size || !cJSON_IsArray(shape) ||
        t[i].info.rank > MODELYARD_MAX_RANK) {
      free_tensors(t, i + 1);
      return my_fail(MODELYARD_CORRUPT, "release.json: io.%s[%zu] needs a name, a known dtype "
                  "(got %s) and a static shape of rank <= %d", what, i, dtype ? dtype : "none",
                  MODELYARD_MAX_RANK);
    }
    for (d = 0; d < t[i].info.rank; d++) {
      const cJSON* dim = cJSON_GetArrayItem(shape, d);
      if (!cJSON_IsNumber(dim) || dim->valuedouble < 0) {
        my_fail(MODELYARD_CORRUPT, "release.json: io.%s[%zu] (%s) has a dynamic dimension",
             what, i, t[i].info.name);
        free_tensors(t, i + 1);
        return MODELYARD_CORRUPT;
      }
      t[i].info.shape[d] = (int64_t)dim->valuedouble;
      elems *= (size_t)t[i].info.shape[d];
    }
    t[i].info.byte_size = elems * t[i].elem_size;
  }
  *out = t;
  *count = n;
  return MODELYARD_OK;
}

/* ------------------------------------------------------------------------------ choosing */
static const char self_anchor = 0;  /* an address inside libmodelyard (or the program, linked statically) */

static const my_backend_ops_t* tvm_backend(void** handle, char* why, size_t why_size) {
  Dl_info self;
  char path[4096];
  const char* slash;
  void* h;
  my_tvm_entry_fn entry = NULL;
  void* symbol;
  int dir;
  if (!dladdr(&self_anchor, &self) || !self.dli_fname) {
    snprintf(why, why_size, "cannot locate libmodelyard itself (dladdr)");
    return NULL;
  }
  /* beside libmodelyard.so; for a program linked with libmodelyard.a, beside the program or in
   * its ../lib (a release's runtime/<arch>/bin and lib) */
  slash = strrchr(self.dli_fname, '/');
  dir = slash ? (int)(slash - self.dli_fname + 1) : 0;
  snprintf(path, sizeof(path), "%.*slibmodelyard_tvm.so", dir, self.dli_fname);
  h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    char first[1024];
    snprintf(first, sizeof(first), "%s", dlerror());
    snprintf(path, sizeof(path), "%.*s../lib/libmodelyard_tvm.so", dir, self.dli_fname);
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      snprintf(why, why_size, "the TVM backend is not loadable: %s", first);
      return NULL;
    }
  }
  symbol = dlsym(h, MY_TVM_ENTRY);
  if (symbol) memcpy(&entry, &symbol, sizeof(entry));  /* POSIX: a function's address as a void* */
  if (!entry) {
    snprintf(why, why_size, "%s has no %s", path, MY_TVM_ENTRY);
    dlclose(h);
    return NULL;
  }
  *handle = h;
  return entry();
}

typedef struct {
  char device[64];     /* HAL device or "cpu" */
  char where[600];     /* for the explain text */
  int tvm;
} my_pick_t;

typedef struct {       /* the Vulkan device, probed once per modelyard_open */
  int probed, found;
  my_vk_device_t dev;
  char why[MY_ERR_SIZE];
} my_vulkan_t;

static const struct { const char* name; uint32_t bit; } SUBGROUP_OPS[] = {  /* VkSubgroupFeatureFlagBits */
    {"basic", 0x1}, {"vote", 0x2}, {"arithmetic", 0x4}, {"ballot", 0x8}, {"shuffle", 0x10},
    {"shuffle_relative", 0x20}, {"clustered", 0x40}, {"quad", 0x80}};

static int number(const cJSON* obj, const char* key, double* out) {
  const cJSON* item = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (cJSON_IsNumber(item)) *out = item->valuedouble;
  return cJSON_IsNumber(item);
}

/* Why `dev` cannot run an artifact compiled with the recorded Vulkan requirements `req` ("" when
 * it can): the API version, device features, subgroup operations and size, workgroup limits;
 * the same rules as pipeline/run/vulkan.py's meets(), plus the workgroup limits. */
static void vulkan_unmet(const cJSON* req, const my_vk_device_t* dev, char* why, size_t why_size) {
  const char* api = str(req, "vulkan_api");
  const cJSON* list;
  const cJSON* it;
  double limit = 0;
  unsigned major = 0, minor = 0;
  size_t k;
  why[0] = 0;
#define UNMET(...) do { size_t n_ = strlen(why); \
    snprintf(why + n_, why_size - n_, "%s", n_ ? "; " : ""); n_ = strlen(why); \
    snprintf(why + n_, why_size - n_, __VA_ARGS__); } while (0)
  if (!api || sscanf(api, "%u.%u", &major, &minor) != 2) {
    UNMET("release.json records no requires.vulkan.vulkan_api");
  } else if (VK_MAKE_API(major, minor) > VK_MAKE_API(VK_MAJOR(dev->api_version), VK_MINOR(dev->api_version))) {
    UNMET("needs Vulkan %s (SPIR-V %s), device has %u.%u", api, str(req, "spirv_version") ? str(req, "spirv_version") : "?",
          VK_MAJOR(dev->api_version), VK_MINOR(dev->api_version));
  }
  list = cJSON_GetObjectItemCaseSensitive(req, "device_features");
  cJSON_ArrayForEach(it, list) {
    int known = 0, on = 0;
    if (!cJSON_IsString(it)) continue;
    for (k = 0; k < dev->n_features; k++)
      if (strcmp(dev->features[k].name, it->valuestring) == 0) { known = 1; on = dev->features[k].on; }
    if (!known) UNMET("needs %s (a feature this runtime cannot query)", it->valuestring);
    else if (!on) UNMET("needs %s", it->valuestring);
  }
  list = cJSON_GetObjectItemCaseSensitive(req, "subgroup_operations");
  cJSON_ArrayForEach(it, list) {
    uint32_t bit = 0;
    if (!cJSON_IsString(it)) continue;
    for (k = 0; k < sizeof(SUBGROUP_OPS) / sizeof(SUBGROUP_OPS[0]); k++)
      if (strcmp(SUBGROUP_OPS[k].name, it->valuestring) == 0) bit = SUBGROUP_OPS[k].bit;
    if (dev->subgroup_operations && !(dev->subgroup_operations & bit))
      UNMET("needs subgroup %s operations", it->valuestring);
  }
  list = cJSON_GetObjectItemCaseSensitive(req, "subgroup_size");
  if (cJSON_GetArraySize(list) > 0) {
    int native = 0, controllable = 0, control = 0;
    char sizes[128] = "";
    for (k = 0; k < dev->n_features; k++)
      if (strcmp(dev->features[k].name, "subgroupSizeControl") == 0) control = dev->features[k].on;
    cJSON_ArrayForEach(it, list) {
      uint32_t size = cJSON_IsNumber(it) ? (uint32_t)it->valuedouble : 0;
      size_t n = strlen(sizes);
      snprintf(sizes + n, sizeof(sizes) - n, "%s%u", n ? ", " : "", size);
      native |= size == dev->subgroup_size;
      controllable |= control && dev->min_subgroup_size <= size && size <= dev->max_subgroup_size;
    }
    if (!native && !controllable)
      UNMET("compiled for subgroup size [%s], device offers %u..%u (it would run and return wrong "
            "numbers)", sizes, dev->min_subgroup_size, dev->max_subgroup_size);
  }
  if (number(req, "max_workgroup_invocations", &limit) && limit > dev->max_workgroup_invocations)
    UNMET("needs %.0f invocations per workgroup, device has %u", limit, dev->max_workgroup_invocations);
  if (number(req, "max_workgroup_memory_bytes", &limit) && limit > dev->max_workgroup_memory_bytes)
    UNMET("needs %.0f bytes of workgroup memory, device has %u", limit, dev->max_workgroup_memory_bytes);
#undef UNMET
}

/* MODELYARD_OK when this machine can run the artifact (pick filled); else why not, and the status
 * a forced choice of it (--abi) gets: INCOMPATIBLE when this device does not meet its recorded
 * requirements, UNAVAILABLE when this runtime has no backend for it. */
static modelyard_status_t why_not(const cJSON* art, const modelyard_options_t* o, my_vulkan_t* vk,
                                  my_pick_t* pick, char* why, size_t why_size) {
  const cJSON* req = cJSON_GetObjectItemCaseSensitive(art, "requires");
  const char* format = str(art, "format");
  const char* backend = str(req, "backend");
  const char* arch = str(req, "arch");
  memset(pick, 0, sizeof(*pick));
  if (!format || !req) {
    snprintf(why, why_size, "release.json gives it no format or requires");
    return MODELYARD_CORRUPT;
  }
  if (strcmp(format, "rknn") == 0) {  /* requires.npu: {target_platform, librknnrt, ...} */
    const cJSON* npu = cJSON_GetObjectItemCaseSensitive(req, "npu");
    const char* platform = cJSON_IsString(npu) ? npu->valuestring : str(npu, "target_platform");
    const char* version = str(npu, "librknnrt");
    snprintf(why, why_size, "this runtime has no RKNN backend; librknnrt%s%s (Rockchip's NPU runtime) "
             "runs .rknn models on the %s NPU: load it with librknnrt's rknn_init on the board, or "
             "use this model's Vulkan or CPU artifact", version ? " " : "", version ? version : "",
             platform ? platform : "RKNPU");
    return MODELYARD_UNAVAILABLE;
  }
  if (strcmp(format, "iree-vmfb") != 0 && strcmp(format, "tvm-so") != 0) {
    snprintf(why, why_size, "format %s is not one this runtime loads (it loads iree-vmfb and tvm-so)",
             format);
    return MODELYARD_UNAVAILABLE;
  }
  if (backend && strcmp(backend, "vulkan-spirv") == 0) {
    const cJSON* vreq = cJSON_GetObjectItemCaseSensitive(req, "vulkan");
    if (!vk->probed) {
      vk->found = my_iree_vulkan_device(&vk->dev, vk->why, sizeof(vk->why));
      vk->probed = 1;
    }
    if (!vk->found) {
      snprintf(why, why_size, "%s", vk->why);
      return MODELYARD_INCOMPATIBLE;
    }
    if (vk->dev.software && !o->allow_software_vulkan) {
      snprintf(why, why_size, "the only Vulkan device is %s, a software rasterizer, not a GPU "
               "(allow_software_vulkan / --allow-software-vulkan to use it anyway)", vk->dev.name);
      return MODELYARD_INCOMPATIBLE;
    }
    if (!cJSON_IsObject(vreq)) {
      snprintf(why, why_size, "release.json records no requires.vulkan for it");
      return MODELYARD_CORRUPT;
    }
    {
      char unmet[MY_ERR_SIZE - 300];
      vulkan_unmet(vreq, &vk->dev, unmet, sizeof(unmet));
      if (unmet[0]) {
        snprintf(why, why_size, "%s: %s", vk->dev.name, unmet);
        return MODELYARD_INCOMPATIBLE;
      }
    }
    snprintf(pick->device, sizeof(pick->device), "vulkan");
    snprintf(pick->where, sizeof(pick->where), "Vulkan device %s (IREE vulkan)", vk->dev.describe);
    return MODELYARD_OK;
  }
  if (!arch) {
    snprintf(why, why_size, "release.json gives it no requires.arch");
    return MODELYARD_CORRUPT;
  }
  if (strcmp(arch, MY_ARCH) != 0) {
    snprintf(why, why_size, "built for %s, this machine is %s", arch, MY_ARCH);
    return MODELYARD_INCOMPATIBLE;
  }
  if (strcmp(format, "tvm-so") == 0) {
    pick->tvm = 1;
    snprintf(pick->device, sizeof(pick->device), "cpu");
    snprintf(pick->where, sizeof(pick->where), "%s CPU (TVM runtime)", MY_ARCH);
    return MODELYARD_OK;
  }
  snprintf(pick->device, sizeof(pick->device), "%s",
           o->cpu_threads == 1 ? "local-sync" : (str(req, "hal_driver") ? str(req, "hal_driver") : "local-task"));
  snprintf(pick->where, sizeof(pick->where), "%s CPU (IREE %s)", MY_ARCH, pick->device);
  return MODELYARD_OK;
}

static void append(char** text, const char* fmt, ...) {
  char line[MY_ERR_SIZE + 256];
  size_t old = *text ? strlen(*text) : 0;
  char* grown;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  grown = (char*)realloc(*text, old + strlen(line) + 1);
  if (!grown) return;
  memcpy(grown + old, line, strlen(line) + 1);
  *text = grown;
}

static modelyard_status_t load_artifact(modelyard_model_t* m, const char* root, const char* abi,
                                        const cJSON* art, const my_pick_t* pick,
                                        const modelyard_options_t* o) {
  const char* file = str(art, "file");
  const char* sha = str(art, "sha256");
  const char* entry = str(art, "entry");
  char path[4096], why[MY_ERR_SIZE] = "";
  size_t size = 0;
  void* bytes;
  my_load_args_t args;
  modelyard_status_t status;
  if (!file || !sha || !entry)
    return my_fail(MODELYARD_CORRUPT, "release.json: artifact %s needs file, sha256 and entry", abi);
  snprintf(path, sizeof(path), "%s/%s", root, file);
  bytes = read_file(path, &size);
  if (!bytes) return my_fail(MODELYARD_NOT_FOUND, "artifact %s: cannot read %s", abi, path);
  if (o->verify_sha256) {
    char hex[65];
    my_sha256_hex(bytes, size, hex);
    if (strcmp(hex, sha) != 0) {
      free(bytes);
      return my_fail(MODELYARD_CORRUPT, "artifact %s: %s has sha256 %s, release.json says %s "
                  "(damaged or tampered: restore the released file)", abi, path, hex, sha);
    }
  }
  if (pick->tvm) {
    m->ops = tvm_backend(&m->plugin, why, sizeof(why));
    if (!m->ops) {
      free(bytes);
      return my_fail(MODELYARD_UNAVAILABLE, "artifact %s: %s", abi, why);
    }
  } else {
    m->ops = my_iree_backend();
  }
  args.path = path; args.bytes = bytes; args.size = size; args.entry = entry;
  args.device = pick->device;
  args.threads = o->cpu_threads;
  args.n_inputs = m->n_inputs; args.n_outputs = m->n_outputs;
  args.inputs = m->inputs; args.outputs = m->outputs;
  status = m->ops->load(&args, &m->state, why);
  free(bytes);
  if (status != MODELYARD_OK)
    return my_fail(status == MODELYARD_RUNTIME_ERROR || status == MODELYARD_INVALID_ARGUMENT
                    ? MODELYARD_INCOMPATIBLE : status,
                "artifact %s (%s) does not load on %s: %s", abi, file, pick->where, why);
  snprintf(m->abi, sizeof(m->abi), "%s", abi);
  snprintf(m->backend_name, sizeof(m->backend_name), "%s", m->ops->name);
  return MODELYARD_OK;
}

modelyard_status_t modelyard_open(const char* root, const char* name,
                                  const modelyard_options_t* options, modelyard_model_t** out) {
  modelyard_options_t given;
  modelyard_model_t* m;
  char path[4096];
  size_t size = 0, i;
  char* text;
  cJSON *doc, *models, *model, *artifacts, *fallback, *io;
  modelyard_status_t status = MODELYARD_OK;
  int chosen = 0, loaded = 0;  /* loaded: an artifact was chosen and its load tried */
  my_clear_error();
  if (out) *out = NULL;
  if (!root || !name || !out) return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_open: NULL argument");
  /* the defaults, overwritten by the caller's options as far as its struct_size reaches */
  modelyard_options_init(&given, sizeof(given));
  if (options) {
    if (!known_options_size(options->struct_size))
      return unknown_options_size("modelyard_open", options->struct_size);
    memcpy(&given, options, options->struct_size);
  }
  options = &given;
  snprintf(path, sizeof(path), "%s/release.json", root);
  text = (char*)read_file(path, &size);
  if (!text) return my_fail(MODELYARD_NOT_FOUND, "cannot read %s (is %s an unpacked release?)", path, root);
  doc = cJSON_ParseWithLength(text, size);
  free(text);
  if (!doc) return my_fail(MODELYARD_CORRUPT, "%s is not valid JSON", path);
  models = cJSON_GetObjectItemCaseSensitive(doc, "models");
  model = cJSON_GetObjectItemCaseSensitive(models, name);
  if (!model) {
    char names[1024] = "";
    const cJSON* it;
    cJSON_ArrayForEach(it, models) {
      if (strlen(names) + strlen(it->string) + 3 < sizeof(names)) {
        if (names[0]) strcat(names, ", ");
        strcat(names, it->string);
      }
    }
    cJSON_Delete(doc);
    return my_fail(MODELYARD_NOT_FOUND, "no model %s in %s (it has: %s)", name, path, names);
  }
  m = (modelyard_model_t*)calloc(1, sizeof(*m));
  if (!m) { cJSON_Delete(doc); return my_fail(MODELYARD_OUT_OF_MEMORY, "out of memory"); }
  if (pthread_mutex_init(&m->lock, NULL) != 0) {
    free(m);
    cJSON_Delete(doc);
    return my_fail(MODELYARD_OUT_OF_MEMORY, "modelyard_open: cannot create the model's mutex");
  }
  io = cJSON_GetObjectItemCaseSensitive(model, "io");
  status = parse_tensors(cJSON_GetObjectItemCaseSensitive(io, "inputs"), "inputs", &m->inputs, &m->n_inputs);
  if (status == MODELYARD_OK)
    status = parse_tensors(cJSON_GetObjectItemCaseSensitive(io, "outputs"), "outputs", &m->outputs,
                           &m->n_outputs);
  artifacts = cJSON_GetObjectItemCaseSensitive(model, "artifacts");
  fallback = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "target"), "fallback");
  if (status == MODELYARD_OK && options->abi && !cJSON_GetObjectItemCaseSensitive(artifacts, options->abi)) {
    char names[1024] = "";
    const cJSON* it;
    cJSON_ArrayForEach(it, artifacts) {
      if (strlen(names) + strlen(it->string) + 3 < sizeof(names)) {
        if (names[0]) strcat(names, ", ");
        strcat(names, it->string);
      }
    }
    status = my_fail(MODELYARD_NOT_FOUND, "no artifact %s for %s (it has: %s)", options->abi, name, names);
  }
  if (status == MODELYARD_OK) {
    /* the order: the forced ABI; else the target's fallback order, then any other artifact */
    const cJSON* order[64];
    size_t n = 0, k;
    const cJSON* it;
    char* passed = NULL;
    if (options->abi) {
      order[n++] = cJSON_GetObjectItemCaseSensitive(artifacts, options->abi);
    } else {
      cJSON_ArrayForEach(it, fallback)
        if (cJSON_IsString(it) && cJSON_GetObjectItemCaseSensitive(artifacts, it->valuestring) && n < 64)
          order[n++] = cJSON_GetObjectItemCaseSensitive(artifacts, it->valuestring);
      cJSON_ArrayForEach(it, artifacts) {
        int seen = 0;
        for (k = 0; k < n; k++) seen |= order[k] == it;
        if (!seen && n < 64) order[n++] = it;
      }
    }
    my_vulkan_t* vk = (my_vulkan_t*)calloc(1, sizeof(*vk));
    status = vk ? MODELYARD_INCOMPATIBLE : my_fail(MODELYARD_OUT_OF_MEMORY, "out of memory");
    for (k = 0; vk && k < n && !chosen; k++) {
      my_pick_t pick;
      char why[MY_ERR_SIZE];
      const char* abi = order[k]->string;
      modelyard_status_t unmet = why_not(order[k], options, vk, &pick, why, sizeof(why));
      if (unmet != MODELYARD_OK) {
        append(&passed, "  passed over %s: %s\n", abi, why);
        if (options->abi)
          status = my_fail(unmet, "artifact %s cannot run here: %s", abi, why);
        continue;
      }
      status = load_artifact(m, root, abi, order[k], &pick, options);
      loaded = 1;
      if (status != MODELYARD_OK) break;  /* a chosen artifact that fails is an error, never a silent switch */
      chosen = 1;
      append(&m->explain, "chose %s (%s) on %s%s\n", abi, str(order[k], "file"), pick.where,
             options->abi ? " [forced]" : "");
      if (passed) append(&m->explain, "%s", passed);
    }
    free(vk);
    if (!chosen && !loaded && status == MODELYARD_INCOMPATIBLE && !options->abi)
      status = my_fail(MODELYARD_INCOMPATIBLE, "no artifact of %s can run on this device:\n%s", name,
                    passed ? passed : "  (no artifacts)\n");
    free(passed);
  }
  cJSON_Delete(doc);
  if (status == MODELYARD_OK) {
    m->input_data = (void**)calloc(m->n_inputs, sizeof(void*));
    m->output_data = (void**)calloc(m->n_outputs, sizeof(void*));
    for (i = 0; m->input_data && i < m->n_inputs; i++)
      if (!(m->input_data[i] = calloc(1, m->inputs[i].info.byte_size + 1))) status = MODELYARD_OUT_OF_MEMORY;
    for (i = 0; m->output_data && i < m->n_outputs; i++)
      if (!(m->output_data[i] = calloc(1, m->outputs[i].info.byte_size + 1))) status = MODELYARD_OUT_OF_MEMORY;
    if (!m->input_data || !m->output_data) status = MODELYARD_OUT_OF_MEMORY;
    if (status != MODELYARD_OK) my_fail(status, "out of memory for the model's tensors");
  }
  if (status != MODELYARD_OK) {
    modelyard_close(m);
    return status;
  }
  *out = m;
  return MODELYARD_OK;
}

void modelyard_close(modelyard_model_t* m) {
  size_t i;
  if (!m) return;
  if (m->ops && m->state) m->ops->destroy(m->state);
  if (m->plugin) dlclose(m->plugin);
  for (i = 0; m->input_data && i < m->n_inputs; i++) free(m->input_data[i]);
  for (i = 0; m->output_data && i < m->n_outputs; i++) free(m->output_data[i]);
  free(m->input_data); free(m->output_data);
  free_tensors(m->inputs, m->n_inputs); free_tensors(m->outputs, m->n_outputs);
  free(m->explain);
  pthread_mutex_destroy(&m->lock);
  free(m);
}

const char* modelyard_explain(const modelyard_model_t* m) { return m && m->explain ? m->explain : ""; }
const char* modelyard_abi(const modelyard_model_t* m) { return m ? m->abi : ""; }
const char* modelyard_backend(const modelyard_model_t* m) { return m ? m->backend_name : ""; }
size_t modelyard_input_count(const modelyard_model_t* m) { return m ? m->n_inputs : 0; }
size_t modelyard_output_count(const modelyard_model_t* m) { return m ? m->n_outputs : 0; }

static modelyard_status_t info(const my_tensor_t* t, size_t n, size_t i, const char* what,
                               modelyard_tensor_info_t* out) {
  if (!t || !out) return my_fail(MODELYARD_INVALID_ARGUMENT, "%s info: NULL argument", what);
  if (i >= n) return my_fail(MODELYARD_INVALID_ARGUMENT, "%s %zu: the model has %zu", what, i, n);
  *out = t[i].info;
  return MODELYARD_OK;
}

modelyard_status_t modelyard_input_info(const modelyard_model_t* m, size_t i, modelyard_tensor_info_t* out) {
  return info(m ? m->inputs : NULL, m ? m->n_inputs : 0, i, "input", out);
}

modelyard_status_t modelyard_output_info(const modelyard_model_t* m, size_t i, modelyard_tensor_info_t* out) {
  return info(m ? m->outputs : NULL, m ? m->n_outputs : 0, i, "output", out);
}

modelyard_status_t modelyard_set_input(modelyard_model_t* m, size_t i, const void* data, size_t bytes) {
  if (!m || !data) return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_set_input: NULL argument");
  if (i >= m->n_inputs)
    return my_fail(MODELYARD_INVALID_ARGUMENT, "input %zu: the model has %zu inputs", i, m->n_inputs);
  if (bytes != m->inputs[i].info.byte_size)
    return my_fail(MODELYARD_INVALID_ARGUMENT, "input %zu (%s): got %zu bytes, expected %zu (%s, %zu elements)",
                i, m->inputs[i].info.name, bytes, m->inputs[i].info.byte_size,
                m->inputs[i].info.dtype_name, m->inputs[i].info.byte_size / m->inputs[i].elem_size);
  pthread_mutex_lock(&m->lock);
  memcpy(m->input_data[i], data, bytes);
  pthread_mutex_unlock(&m->lock);
  return MODELYARD_OK;
}

modelyard_status_t modelyard_run(modelyard_model_t* m) {
  char err[MY_ERR_SIZE] = "";
  modelyard_status_t status;
  modelyard_timing_t timing = {0, 0, 0};
  if (!m) return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_run: NULL model");
  pthread_mutex_lock(&m->lock);
  status = m->ops->run(m->state, (const void* const*)m->input_data, m->output_data, &timing, err);
  m->ran = status == MODELYARD_OK;  /* a failed run may have written some outputs: none is read */
  if (status == MODELYARD_OK) m->timing = timing;
  pthread_mutex_unlock(&m->lock);
  if (status != MODELYARD_OK) return my_fail(status, "%s: running %s: %s", m->abi, m->backend_name, err);
  return MODELYARD_OK;
}

/* The mutex of a model a const entry point reads under (the lock is not part of its value). */
static pthread_mutex_t* lock_of(const modelyard_model_t* m) { return (pthread_mutex_t*)&m->lock; }

modelyard_status_t modelyard_get_output(const modelyard_model_t* m, size_t i, void* data, size_t bytes) {
  int ran;
  if (!m || !data) return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_get_output: NULL argument");
  if (i >= m->n_outputs)
    return my_fail(MODELYARD_INVALID_ARGUMENT, "output %zu: the model has %zu outputs", i, m->n_outputs);
  if (bytes != m->outputs[i].info.byte_size)
    return my_fail(MODELYARD_INVALID_ARGUMENT, "output %zu (%s): got room for %zu bytes, it has %zu",
                i, m->outputs[i].info.name, bytes, m->outputs[i].info.byte_size);
  pthread_mutex_lock(lock_of(m));
  ran = m->ran;
  if (ran) memcpy(data, m->output_data[i], bytes);
  pthread_mutex_unlock(lock_of(m));
  if (!ran)
    return my_fail(MODELYARD_INVALID_ARGUMENT, "output %zu: no successful modelyard_run yet (none, or the "
                "last one failed)", i);
  return MODELYARD_OK;
}

modelyard_status_t modelyard_last_timing(const modelyard_model_t* m, modelyard_timing_t* out) {
  if (!m || !out) return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_last_timing: NULL argument");
  pthread_mutex_lock(lock_of(m));
  *out = m->timing;
  pthread_mutex_unlock(lock_of(m));
  return MODELYARD_OK;
}

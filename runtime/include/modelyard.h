/* modelyard.h: run a model of an unpacked modelyard release from C (C99).
 *
 *   modelyard_model_t* m;
 *   if (modelyard_open("/opt/modelyard/current", "ppocr_det", NULL, &m) != MODELYARD_OK)
 *     fprintf(stderr, "%s\n", modelyard_last_error());
 *   puts(modelyard_explain(m));                 which artifact, on which device, and why
 *   modelyard_set_input(m, 0, image, bytes);    caller memory in (sizes checked)
 *   modelyard_run(m);
 *   modelyard_get_output(m, 0, probs, bytes);   caller memory out
 *   modelyard_close(m);
 *
 * The release's release.json drives it: the model's I/O contract (`io`), the target's fallback
 * order, and per artifact its file, sha256 and `requires`. modelyard_open walks the fallback
 * order and loads the first artifact this device can run, as pipeline/run/app.py's Runner does:
 * a Vulkan artifact when the device IREE's Vulkan driver would use meets the artifact's recorded
 * requirements (API version, features, subgroup size; a software rasterizer only when asked),
 * else the CPU artifact of this machine's architecture the release ships (IREE local-task, or
 * TVM's runtime for a `tvm-so` artifact); an NPU (`rknn`) artifact is passed over. Every function returns a status; none aborts. The message of
 * the last failure of the calling thread is modelyard_last_error(). See docs/runtime.md.
 */
#ifndef MODELYARD_H_
#define MODELYARD_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MODELYARD_BUILDING)
#define MODELYARD_API __attribute__((visibility("default")))
#else
#define MODELYARD_API
#endif

typedef enum modelyard_status_e {
  MODELYARD_OK = 0,
  MODELYARD_INVALID_ARGUMENT = 1,  /* a NULL, an index out of range, a size that does not match */
  MODELYARD_NOT_FOUND = 2,         /* no such release file, model or artifact */
  MODELYARD_CORRUPT = 3,           /* release.json unreadable, an artifact's sha256 differs */
  MODELYARD_INCOMPATIBLE = 4,      /* no artifact this device can run; one built for another device */
  MODELYARD_UNAVAILABLE = 5,       /* a backend (driver, TVM plugin) cannot be loaded here */
  MODELYARD_RUNTIME_ERROR = 6,     /* the backend failed while loading or running */
  MODELYARD_OUT_OF_MEMORY = 7,
} modelyard_status_t;

typedef enum modelyard_dtype_e {
  MODELYARD_FLOAT32, MODELYARD_FLOAT16, MODELYARD_FLOAT64, MODELYARD_INT8, MODELYARD_UINT8,
  MODELYARD_INT16, MODELYARD_UINT16, MODELYARD_INT32, MODELYARD_UINT32, MODELYARD_INT64,
  MODELYARD_UINT64, MODELYARD_BOOL,
} modelyard_dtype_t;

#define MODELYARD_MAX_RANK 8

typedef struct modelyard_tensor_info_s {
  const char* name;                    /* as the release's io names it */
  modelyard_dtype_t dtype;
  const char* dtype_name;              /* "float32", "uint8", ... */
  int rank;
  int64_t shape[MODELYARD_MAX_RANK];
  size_t byte_size;                    /* elements x element size: what set/get expect */
} modelyard_tensor_info_t;

typedef struct modelyard_options_s {
  const char* abi;            /* force this artifact (its ABI name), or a clear error; NULL: choose */
  int allow_software_vulkan;  /* 1: a software rasterizer (lavapipe) counts as a Vulkan device */
  int cpu_threads;            /* IREE CPU: 1 = local-sync (in the caller's thread), N > 1 = N
                                 local-task workers, 0 = the artifact's driver with its default
                                 (local-task: one worker per core) */
  int verify_sha256;          /* 1 (the default when options is NULL): check the artifact's sha256 */
} modelyard_options_t;

typedef struct modelyard_timing_s {  /* the last modelyard_run, in nanoseconds */
  uint64_t copy_in_ns;    /* inputs from the model's host buffers to the device */
  uint64_t invoke_ns;     /* the runtime's invoke of the entry function */
  uint64_t copy_out_ns;   /* outputs from the device to the model's host buffers */
} modelyard_timing_t;

typedef struct modelyard_model_s modelyard_model_t;

/* Fills *options with the defaults (verify_sha256 = 1, the rest 0/NULL). */
MODELYARD_API void modelyard_default_options(modelyard_options_t* options);

/* Opens `model` of the release unpacked at `release_dir` (options may be NULL). */
MODELYARD_API modelyard_status_t modelyard_open(const char* release_dir, const char* model,
                                                const modelyard_options_t* options,
                                                modelyard_model_t** out_model);
MODELYARD_API void modelyard_close(modelyard_model_t* model);

/* Which artifact was chosen, on which device, and why each one before it was passed over. */
MODELYARD_API const char* modelyard_explain(const modelyard_model_t* model);
MODELYARD_API const char* modelyard_abi(const modelyard_model_t* model);     /* e.g. "cpu-aarch64" */
MODELYARD_API const char* modelyard_backend(const modelyard_model_t* model); /* "iree" or "tvm" */

MODELYARD_API size_t modelyard_input_count(const modelyard_model_t* model);
MODELYARD_API size_t modelyard_output_count(const modelyard_model_t* model);
MODELYARD_API modelyard_status_t modelyard_input_info(const modelyard_model_t* model, size_t index,
                                                      modelyard_tensor_info_t* out_info);
MODELYARD_API modelyard_status_t modelyard_output_info(const modelyard_model_t* model, size_t index,
                                                       modelyard_tensor_info_t* out_info);

/* Copies byte_size bytes (exactly the input's byte_size) from caller memory. */
MODELYARD_API modelyard_status_t modelyard_set_input(modelyard_model_t* model, size_t index,
                                                     const void* data, size_t byte_size);
MODELYARD_API modelyard_status_t modelyard_run(modelyard_model_t* model);
/* Copies the output of the last run (exactly its byte_size bytes) into caller memory. */
MODELYARD_API modelyard_status_t modelyard_get_output(const modelyard_model_t* model, size_t index,
                                                      void* data, size_t byte_size);
MODELYARD_API modelyard_status_t modelyard_last_timing(const modelyard_model_t* model,
                                                       modelyard_timing_t* out_timing);

/* The message of the calling thread's last failure ("" when none). */
MODELYARD_API const char* modelyard_last_error(void);
MODELYARD_API const char* modelyard_status_name(modelyard_status_t status);
/* The vendored IREE runtime's commit and HAL module version (what .vmfb files it loads). */
MODELYARD_API const char* modelyard_iree_commit(void);
MODELYARD_API int modelyard_iree_hal_version(void);

#ifdef __cplusplus
}
#endif
#endif /* MODELYARD_H_ */

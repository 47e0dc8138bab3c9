/* modelyard.h: run a model of an unpacked modelyard release from C. This header is C99 (and
 * C++); the library itself is built as C11.
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
 * order and loads the first artifact this device can run, as pipeline/app/runner.py's Runner
 * does: a Vulkan artifact when the device IREE's Vulkan driver would use meets the artifact's
 * recorded requirements (API version, features, subgroup size; a software rasterizer only when
 * asked), else the CPU artifact of this machine's architecture the release ships (IREE
 * local-task, or TVM's runtime for a `tvm-so` artifact); an NPU (`rknn`) artifact is passed over.
 * See docs/runtime.md.
 *
 * Errors. Every call that can fail returns a modelyard_status_t; none aborts, none prints. On a
 * failure the calling thread's modelyard_last_error() says what and why; a call that succeeds
 * leaves it as it was (modelyard_open clears it first). Out-parameters are written only on
 * success (modelyard_open's *out_model: NULL on failure).
 *
 * Threads. Every call may be made from any thread. Calls on one model handle are serialised by
 * the handle's own mutex: two threads may share a handle, each call is atomic, but one thread's
 * set_input -> run -> get_output sequence can interleave with another's (hold a lock of your own
 * over the sequence, or, to run in parallel, open one handle per thread: handles share nothing).
 * modelyard_close must be the last call on a handle, made when no other thread uses it. Several
 * threads may open models at the same time.
 *
 * Ownership. The library never keeps or frees caller memory. Strings and tensor descriptions it
 * returns are owned by the library, never NULL, and must not be freed: those of a model
 * (explain, abi, backend, a tensor info's name) live until modelyard_close of that model; the
 * others are static or, for modelyard_last_error, per thread (see there).
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

/* The version of this header; modelyard_version() is the library's. Semantic versioning: while
 * the major version is 0, a minor version may change the ABI (pyproject.toml's version). */
#define MODELYARD_VERSION_MAJOR 0
#define MODELYARD_VERSION_MINOR 1
#define MODELYARD_VERSION_PATCH 0
#define MODELYARD_VERSION_STRING "0.1.0"

typedef enum modelyard_status_e {
  MODELYARD_OK = 0,
  MODELYARD_INVALID_ARGUMENT = 1,  /* a NULL, an index out of range, a size that does not match */
  MODELYARD_NOT_FOUND = 2,         /* no such release file, model or artifact */
  MODELYARD_CORRUPT = 3,           /* release.json unreadable, an artifact's sha256 differs */
  MODELYARD_INCOMPATIBLE = 4,      /* no artifact this device can run; one built for another device */
  MODELYARD_UNAVAILABLE = 5,       /* a backend (driver, TVM plugin) cannot be loaded here */
  MODELYARD_RUNTIME_ERROR = 6,     /* the backend failed while loading or running */
  MODELYARD_OUT_OF_MEMORY = 7
} modelyard_status_t;

typedef enum modelyard_dtype_e {
  MODELYARD_FLOAT32, MODELYARD_FLOAT16, MODELYARD_FLOAT64, MODELYARD_INT8, MODELYARD_UINT8,
  MODELYARD_INT16, MODELYARD_UINT16, MODELYARD_INT32, MODELYARD_UINT32, MODELYARD_INT64,
  MODELYARD_UINT64, MODELYARD_BOOL
} modelyard_dtype_t;

#define MODELYARD_MAX_RANK 8

typedef struct modelyard_tensor_info_s {
  const char* name;                    /* as the release's io names it; owned by the model */
  modelyard_dtype_t dtype;
  const char* dtype_name;              /* "float32", "uint8", ...: static */
  int rank;
  int64_t shape[MODELYARD_MAX_RANK];
  size_t byte_size;                    /* elements x element size: what set/get expect */
} modelyard_tensor_info_t;

/* Options of modelyard_open. The struct grows at its end in later versions: always initialise
 * it with modelyard_default_options (or modelyard_options_init), which sets struct_size to the
 * size this header compiled. A library accepts the size of every header version it knows; any
 * other struct_size (0: not initialised; larger: a newer header than the library) is refused
 * with MODELYARD_INVALID_ARGUMENT, and nothing past struct_size is ever read. */
typedef struct modelyard_options_s {
  size_t struct_size;         /* sizeof(modelyard_options_t) of the caller's header */
  const char* abi;            /* force this artifact (its ABI name), or a clear error; NULL: choose.
                                 Read during modelyard_open only (not kept). */
  int allow_software_vulkan;  /* 1: a software rasterizer (lavapipe) counts as a Vulkan device */
  int cpu_threads;            /* IREE CPU: 1 = local-sync (in the caller's thread), N > 1 = N
                                 local-task workers, 0 = the artifact's driver with its default
                                 (local-task: one worker per usable core) */
  int verify_sha256;          /* 1 (the default, and when options is NULL): check the artifact's
                                 sha256 before loading it */
} modelyard_options_t;

typedef struct modelyard_timing_s {  /* the last modelyard_run, in nanoseconds */
  uint64_t copy_in_ns;    /* inputs from the model's host buffers to the device */
  uint64_t invoke_ns;     /* the runtime's invoke of the entry function */
  uint64_t copy_out_ns;   /* outputs from the device to the model's host buffers */
} modelyard_timing_t;

/* An opened model: opaque, created by modelyard_open, freed by modelyard_close. */
typedef struct modelyard_model_s modelyard_model_t;

/* ------------------------------------------------------------------------------------ library */
/* The library's semantic version, e.g. "0.1.0" (static storage). Compare its major and minor
 * with MODELYARD_VERSION_MAJOR/MINOR to detect a header/library mismatch. */
MODELYARD_API const char* modelyard_version(void);

/* The name of a status, e.g. "NOT_FOUND"; "UNKNOWN" for a value that is none (static storage). */
MODELYARD_API const char* modelyard_status_name(modelyard_status_t status);

/* The message of the calling thread's last failure ("" when none yet). The buffer belongs to the
 * calling thread: valid until the thread exits, overwritten by that thread's next failure (and
 * cleared by its next modelyard_open); other threads' failures never touch it. */
MODELYARD_API const char* modelyard_last_error(void);

/* The vendored IREE runtime's commit (static storage) and HAL module version (what .vmfb files
 * it loads: those importing `hal` at this version or below). */
MODELYARD_API const char* modelyard_iree_commit(void);
MODELYARD_API int modelyard_iree_hal_version(void);

/* ------------------------------------------------------------------------------------ options */
/* Fills the first struct_size bytes of *options with the defaults (verify_sha256 = 1, the rest
 * 0/NULL) and sets options->struct_size. INVALID_ARGUMENT (nothing written): options is NULL or
 * struct_size is not the size of a modelyard_options_t this library knows. */
MODELYARD_API modelyard_status_t modelyard_options_init(modelyard_options_t* options,
                                                        size_t struct_size);

/* modelyard_options_init with this header's size: what a program calls. */
static inline modelyard_status_t modelyard_default_options(modelyard_options_t* options) {
  return modelyard_options_init(options, sizeof(modelyard_options_t));
}

/* ------------------------------------------------------------------------------------ a model */
/* Opens `model` of the release unpacked at `release_dir` and loads the artifact it chooses
 * (options may be NULL: the defaults). On success *out_model is a new handle, owned by the
 * caller until modelyard_close; on failure *out_model is NULL (when out_model is not).
 * Statuses: INVALID_ARGUMENT (a NULL release_dir/model/out_model, options->struct_size unknown),
 * NOT_FOUND (no release.json, no such model, options->abi names no artifact, an artifact file
 * missing), CORRUPT (release.json unreadable or inconsistent, a sha256 that differs),
 * INCOMPATIBLE (no artifact this device can run; a forced one it cannot), UNAVAILABLE (no backend
 * here for the forced artifact: RKNN, a missing TVM plugin), OUT_OF_MEMORY. */
MODELYARD_API modelyard_status_t modelyard_open(const char* release_dir, const char* model,
                                                const modelyard_options_t* options,
                                                modelyard_model_t** out_model);

/* Frees the model and everything it returned (strings, tensor names). NULL: nothing. The last call
 * on a handle: no other thread may use it then, nor anyone after. */
MODELYARD_API void modelyard_close(modelyard_model_t* model);

/* Which artifact was chosen, on which device, and why each one before it was passed over: lines
 * ending in '\n'. Owned by the model (until modelyard_close); "" for NULL. */
MODELYARD_API const char* modelyard_explain(const modelyard_model_t* model);
/* The chosen artifact's ABI, e.g. "cpu-aarch64". Owned by the model; "" for NULL. */
MODELYARD_API const char* modelyard_abi(const modelyard_model_t* model);
/* The backend running it: "iree" or "tvm". Owned by the model; "" for NULL. */
MODELYARD_API const char* modelyard_backend(const modelyard_model_t* model);

/* The number of inputs / outputs (release.json's io); 0 for NULL. */
MODELYARD_API size_t modelyard_input_count(const modelyard_model_t* model);
MODELYARD_API size_t modelyard_output_count(const modelyard_model_t* model);
/* Copies the description of input / output `index` into *out_info; its name is owned by the
 * model (until modelyard_close). INVALID_ARGUMENT: a NULL, an index out of range. */
MODELYARD_API modelyard_status_t modelyard_input_info(const modelyard_model_t* model, size_t index,
                                                      modelyard_tensor_info_t* out_info);
MODELYARD_API modelyard_status_t modelyard_output_info(const modelyard_model_t* model, size_t index,
                                                       modelyard_tensor_info_t* out_info);

/* Copies byte_size bytes (exactly the input's byte_size) from caller memory into the model's
 * input buffer; `data` is not kept. Inputs never set are zeros. INVALID_ARGUMENT: a NULL, an
 * index out of range, a byte_size that differs. */
MODELYARD_API modelyard_status_t modelyard_set_input(modelyard_model_t* model, size_t index,
                                                     const void* data, size_t byte_size);
/* Runs the model on its current inputs; the outputs and the timing are kept until the next run.
 * INVALID_ARGUMENT: NULL; RUNTIME_ERROR (or the backend's status, e.g. CORRUPT for an output
 * that is not what release.json declares): the backend failed. The handle stays usable, but
 * modelyard_get_output refuses until a run succeeds again. */
MODELYARD_API modelyard_status_t modelyard_run(modelyard_model_t* model);
/* Copies output `index` of the last run (exactly its byte_size bytes) into caller memory.
 * INVALID_ARGUMENT: a NULL, an index out of range, a byte_size that differs, no successful run
 * yet (or the last run failed). */
MODELYARD_API modelyard_status_t modelyard_get_output(const modelyard_model_t* model, size_t index,
                                                      void* data, size_t byte_size);
/* The timing of the last successful run (zeros before the first). INVALID_ARGUMENT: a NULL. */
MODELYARD_API modelyard_status_t modelyard_last_timing(const modelyard_model_t* model,
                                                       modelyard_timing_t* out_timing);

/* ------------------------------------------------------------------- host-side post-processing */
/* A detector built with `postprocess: {cut: ...}` (docs/postprocess.md) returns the tensors its
 * NonMaxSuppression reads (boxes, scores); the release ships the removed post-processing as
 * models/<model>/postprocess.onnx. modelyard_nms_boxes is that NMS in C, for an app that runs no
 * onnxruntime: the selection of ONNX NonMaxSuppression as onnxruntime's CPU kernel makes it. */
typedef struct modelyard_nms_options_s {
  size_t struct_size;       /* sizeof(modelyard_nms_options_t): set by modelyard_nms_options_init */
  float iou_threshold;      /* a box is dropped when its IoU with a kept one is above this [0, 1] */
  float score_threshold;    /* ... and, with use_score_threshold, when its score is not above this */
  int use_score_threshold;  /* 0: every score counts (ONNX: no score_threshold input) */
  size_t max_per_class;     /* the most boxes kept per batch and class; 0: none (as ONNX) */
  int center_point_box;     /* 0: [y1, x1, y2, x2] (either corner first); 1: [xc, yc, w, h] */
} modelyard_nms_options_t;

/* Fills *options with the defaults (every threshold 0, no score threshold, max_per_class 0,
 * corners) and sets struct_size. INVALID_ARGUMENT (nothing written): NULL, or a struct_size
 * this library does not know. */
MODELYARD_API modelyard_status_t modelyard_nms_options_init(modelyard_nms_options_t* options,
                                                            size_t struct_size);
static inline modelyard_status_t modelyard_default_nms_options(modelyard_nms_options_t* options) {
  return modelyard_nms_options_init(options, sizeof(modelyard_nms_options_t));
}

/* boxes: [num_batches][num_boxes][4] floats; scores: [num_batches][num_classes][num_boxes].
 * Writes the selected boxes as rows (batch, class, box index) of int64 into out_selected (room
 * for `capacity` rows: at least num_batches x num_classes x min(max_per_class, num_boxes)), in
 * ONNX's order (batch, then class, then falling score; a tie: the lower box index first), and
 * their number into *out_count. Caller memory in and out, nothing kept; no state, so any thread
 * may call it at any time (it allocates and frees scratch memory of num_boxes x 28 bytes).
 * INVALID_ARGUMENT: a NULL, options not initialised, iou_threshold outside [0, 1], capacity too
 * small (nothing written); OUT_OF_MEMORY. */
MODELYARD_API modelyard_status_t modelyard_nms_boxes(const float* boxes, const float* scores,
                                                     size_t num_batches, size_t num_classes,
                                                     size_t num_boxes,
                                                     const modelyard_nms_options_t* options,
                                                     int64_t* out_selected, size_t capacity,
                                                     size_t* out_count);

#ifdef __cplusplus
}
#endif
#endif /* MODELYARD_H_ */

/* C tests of every entry point of modelyard.h, errors included (ISO C99 + POSIX threads).
 *
 *   test_api RELEASE MODEL ABI INPUT OUTPUT
 *
 * RELEASE is an unpacked release whose MODEL has one input and one output, ABI one of its
 * artifacts this machine runs; INPUT holds the input's bytes. The program writes the output of
 * the run to OUTPUT (the caller compares it with the golden vector) and prints one line per
 * check ("ok ..." / "not ok ..."); exit status 0 only when every check passed. The statuses a
 * release file can cause (CORRUPT, INCOMPATIBLE, UNAVAILABLE, NOT_FOUND of an artifact) come from
 * small releases it writes itself into a temporary folder. Built against an installed runtime by
 * runtime/tests/CMakeLists.txt, twice: with libmodelyard.so and with libmodelyard.a. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modelyard.h"

#if defined(__aarch64__)
#define OTHER_ARCH "x86_64"
#define THIS_ARCH "aarch64"
#else
#define OTHER_ARCH "aarch64"
#define THIS_ARCH "x86_64"
#endif

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                             \
  do {                                                               \
    checks++;                                                        \
    if (cond) {                                                      \
      printf("ok %d - ", checks);                                    \
    } else {                                                         \
      failures++;                                                    \
      printf("not ok %d - (%s:%d) ", checks, __FILE__, __LINE__);    \
    }                                                                \
    printf(__VA_ARGS__);                                             \
    printf("\n");                                                    \
    fflush(stdout);                                                  \
  } while (0)

/* status == want, and the thread's last error contains `text` */
#define CHECK_STATUS(status, want, text, what)                                                   \
  do {                                                                                           \
    modelyard_status_t got_ = (status);                                                          \
    CHECK(got_ == (want) && strstr(modelyard_last_error(), (text)) != NULL,                      \
          "%s: %s (want %s) \"%s\"", (what), modelyard_status_name(got_),                         \
          modelyard_status_name(want), modelyard_last_error());                                  \
  } while (0)

static void* read_all(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  char* data = NULL;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
    data = (char*)malloc((size_t)n + 1);
    if (data && fread(data, 1, (size_t)n, f) != (size_t)n) { free(data); data = NULL; }
    if (data) *size = (size_t)n;
  }
  fclose(f);
  return data;
}

static int write_all(const char* path, const void* data, size_t size) {
  FILE* f = fopen(path, "wb");
  int ok = f && fwrite(data, 1, size, f) == size;
  if (f) ok &= fclose(f) == 0;
  return ok;
}

/* ------------------------------------------------------------------------------ the library */
static void* fresh_thread_error(void* arg) {
  (void)arg;
  return (void*)modelyard_last_error();  /* a thread that never failed: "" */
}

static void test_library(void) {
  char major[32];
  const char* version = modelyard_version();
  pthread_t t;
  void* text = NULL;
  int k;
  CHECK(strcmp(version, MODELYARD_VERSION_STRING) == 0, "modelyard_version() %s == the header's %s",
        version, MODELYARD_VERSION_STRING);
  snprintf(major, sizeof(major), "%d.%d.%d", MODELYARD_VERSION_MAJOR, MODELYARD_VERSION_MINOR,
           MODELYARD_VERSION_PATCH);
  CHECK(strcmp(major, MODELYARD_VERSION_STRING) == 0, "MODELYARD_VERSION_MAJOR/MINOR/PATCH make %s", major);
  {
    static const char* names[] = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "CORRUPT", "INCOMPATIBLE",
                                  "UNAVAILABLE", "RUNTIME_ERROR", "OUT_OF_MEMORY"};
    int all = 1;
    for (k = 0; k < 8; k++) all &= strcmp(modelyard_status_name((modelyard_status_t)k), names[k]) == 0;
    CHECK(all, "modelyard_status_name of every status");
  }
  CHECK(strcmp(modelyard_status_name((modelyard_status_t)99), "UNKNOWN") == 0 &&
        strcmp(modelyard_status_name((modelyard_status_t)-1), "UNKNOWN") == 0, "modelyard_status_name(99, -1) is UNKNOWN");
  CHECK(strlen(modelyard_iree_commit()) == 40 && strspn(modelyard_iree_commit(), "0123456789abcdef") == 40,
        "modelyard_iree_commit() %s", modelyard_iree_commit());
  CHECK(modelyard_iree_hal_version() >= 7, "modelyard_iree_hal_version() %d", modelyard_iree_hal_version());
  CHECK(pthread_create(&t, NULL, fresh_thread_error, NULL) == 0 && pthread_join(t, &text) == 0 &&
        text && ((const char*)text)[0] == 0, "modelyard_last_error() of a thread that never failed is \"\"");
}

/* ------------------------------------------------------------------------------ options */
static void test_options(void) {
  modelyard_options_t o;
  unsigned char raw[sizeof(modelyard_options_t) + 16];
  size_t k;
  int untouched = 1;
  CHECK_STATUS(modelyard_options_init(NULL, sizeof(o)), MODELYARD_INVALID_ARGUMENT, "NULL options",
               "modelyard_options_init(NULL)");
  memset(raw, 0xAB, sizeof(raw));
  CHECK_STATUS(modelyard_options_init((modelyard_options_t*)(void*)raw, 0), MODELYARD_INVALID_ARGUMENT,
               "struct_size is 0", "modelyard_options_init(size 0)");
  CHECK_STATUS(modelyard_options_init((modelyard_options_t*)(void*)raw, sizeof(o) + 8), MODELYARD_INVALID_ARGUMENT,
               "a header newer than the library", "modelyard_options_init(a larger size)");
  CHECK_STATUS(modelyard_options_init((modelyard_options_t*)(void*)raw, sizeof(o) - sizeof(int)),
               MODELYARD_INVALID_ARGUMENT, "initialise the options", "modelyard_options_init(a smaller size)");
  for (k = 0; k < sizeof(raw); k++) untouched &= raw[k] == 0xAB;
  CHECK(untouched, "a refused size writes nothing");
  memset(&o, 0x5A, sizeof(o));
  CHECK(modelyard_default_options(&o) == MODELYARD_OK && o.struct_size == sizeof(o) && o.abi == NULL &&
        o.allow_software_vulkan == 0 && o.cpu_threads == 0 && o.verify_sha256 == 1,
        "modelyard_default_options: struct_size %zu, verify_sha256 1, the rest 0/NULL", o.struct_size);
}

/* ------------------------------------------------------------------------------ statuses from files */
static char scratch[256];
static const char* written[16];  /* the folders write_release made, removed at the end */
static size_t n_written = 0;

static void write_release(const char* folder_name, const char* release_json, const char* artifact) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", scratch, folder_name);
  if (mkdir(path, 0755) != 0) fprintf(stderr, "cannot make %s\n", path);
  else if (n_written < sizeof(written) / sizeof(written[0])) written[n_written++] = folder_name;
  snprintf(path, sizeof(path), "%s/%s/release.json", scratch, folder_name);
  if (!write_all(path, release_json, strlen(release_json))) fprintf(stderr, "cannot write %s\n", path);
  if (artifact) {
    snprintf(path, sizeof(path), "%s/%s/a.bin", scratch, folder_name);
    if (!write_all(path, artifact, strlen(artifact))) fprintf(stderr, "cannot write %s\n", path);
  }
}

static void remove_scratch(void) {
  char path[512];
  size_t k;
  for (k = 0; k < n_written; k++) {
    snprintf(path, sizeof(path), "%s/%s/release.json", scratch, written[k]);
    remove(path);
    snprintf(path, sizeof(path), "%s/%s/a.bin", scratch, written[k]);
    remove(path);
    snprintf(path, sizeof(path), "%s/%s", scratch, written[k]);
    if (rmdir(path) != 0) fprintf(stderr, "cannot remove %s\n", path);
  }
  if (rmdir(scratch) != 0) fprintf(stderr, "cannot remove %s\n", scratch);
}

#define IO "\"io\": {\"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", \"shape\": [1, 4]}], " \
           "\"outputs\": [{\"name\": \"y\", \"dtype\": \"float32\", \"shape\": [1, 4]}]}"

static modelyard_status_t open_in(const char* folder_name, const char* model, const modelyard_options_t* o,
                                  modelyard_model_t** m) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", scratch, folder_name);
  return modelyard_open(path, model, o, m);
}

static void test_open_errors(const char* release, const char* model) {
  modelyard_model_t* m = (modelyard_model_t*)(void*)&m;  /* not NULL: open must reset it */
  modelyard_options_t o;
  char text[2048];
  CHECK_STATUS(modelyard_open(NULL, model, NULL, &m), MODELYARD_INVALID_ARGUMENT, "NULL argument",
               "modelyard_open(NULL release)");
  CHECK(m == NULL, "a failed modelyard_open sets *out_model to NULL");
  CHECK_STATUS(modelyard_open(release, NULL, NULL, &m), MODELYARD_INVALID_ARGUMENT, "NULL argument",
               "modelyard_open(NULL model)");
  CHECK_STATUS(modelyard_open(release, model, NULL, NULL), MODELYARD_INVALID_ARGUMENT, "NULL argument",
               "modelyard_open(NULL out_model)");
  memset(&o, 0, sizeof(o));  /* struct_size 0: never initialised */
  CHECK_STATUS(modelyard_open(release, model, &o, &m), MODELYARD_INVALID_ARGUMENT, "struct_size is 0",
               "modelyard_open(options never initialised)");
  modelyard_default_options(&o);
  o.struct_size = sizeof(o) + 64;  /* a newer header than this library */
  CHECK_STATUS(modelyard_open(release, model, &o, &m), MODELYARD_INVALID_ARGUMENT, "a header newer than the library",
               "modelyard_open(options of an unknown size)");
  CHECK_STATUS(modelyard_open("/nonexistent/release", model, NULL, &m), MODELYARD_NOT_FOUND,
               "cannot read /nonexistent/release/release.json", "modelyard_open(no release there)");
  CHECK_STATUS(modelyard_open(release, "no-such-model", NULL, &m), MODELYARD_NOT_FOUND, "no model no-such-model",
               "modelyard_open(an unknown model)");
  CHECK(strstr(modelyard_last_error(), model) != NULL, "... and the message lists the release's models");
  modelyard_default_options(&o);
  o.abi = "cpu-riscv64";
  CHECK_STATUS(modelyard_open(release, model, &o, &m), MODELYARD_NOT_FOUND, "no artifact cpu-riscv64",
               "modelyard_open(an unknown abi)");

  write_release("not-json", "{\"models\": ", NULL);
  CHECK_STATUS(open_in("not-json", "m", NULL, &m), MODELYARD_CORRUPT, "is not valid JSON",
               "modelyard_open(release.json not JSON)");
  write_release("dynamic", "{\"models\": {\"m\": {\"io\": {\"inputs\": [{\"name\": \"x\", \"dtype\": \"float32\", "
                "\"shape\": [1, -1]}], \"outputs\": []}, \"artifacts\": {}}}}", NULL);
  CHECK_STATUS(open_in("dynamic", "m", NULL, &m), MODELYARD_CORRUPT, "(x) has a dynamic dimension",
               "modelyard_open(an io shape with a dynamic dimension)");
  write_release("dtype", "{\"models\": {\"m\": {\"io\": {\"inputs\": [{\"name\": \"x\", \"dtype\": \"complex64\", "
                "\"shape\": [1]}], \"outputs\": []}, \"artifacts\": {}}}}", NULL);
  CHECK_STATUS(open_in("dtype", "m", NULL, &m), MODELYARD_CORRUPT, "a known dtype (got complex64)",
               "modelyard_open(an io dtype it does not know)");

  /* one artifact, named by the fallback order: what it is decides the status */
  snprintf(text, sizeof(text), "{\"target\": {\"fallback\": [\"cpu\"]}, \"models\": {\"m\": {" IO ", "
           "\"artifacts\": {\"cpu\": {\"file\": \"a.bin\", \"sha256\": \"%s\", \"format\": \"iree-vmfb\", "
           "\"entry\": \"main\", \"requires\": {\"arch\": \"" THIS_ARCH "\", \"backend\": \"llvm-cpu\"}}}}}}",
           "0000000000000000000000000000000000000000000000000000000000000000");
  write_release("tampered", text, "not a module");
  CHECK_STATUS(open_in("tampered", "m", NULL, &m), MODELYARD_CORRUPT, "damaged or tampered",
               "modelyard_open(an artifact whose sha256 differs)");
  modelyard_default_options(&o);
  o.verify_sha256 = 0;  /* not checked: IREE itself refuses the bytes */
  CHECK_STATUS(open_in("tampered", "m", &o, &m), MODELYARD_INCOMPATIBLE, "does not load on " THIS_ARCH " CPU",
               "modelyard_open(verify_sha256 0, bytes that are no module)");
  CHECK(m == NULL, "... and no handle");
  write_release("missing", "{\"target\": {\"fallback\": [\"cpu\"]}, \"models\": {\"m\": {" IO ", \"artifacts\": "
                "{\"cpu\": {\"file\": \"gone.vmfb\", \"sha256\": \"00\", \"format\": \"iree-vmfb\", \"entry\": "
                "\"main\", \"requires\": {\"arch\": \"" THIS_ARCH "\"}}}}}}", NULL);
  CHECK_STATUS(open_in("missing", "m", NULL, &m), MODELYARD_NOT_FOUND, "cannot read",
               "modelyard_open(an artifact file that is missing)");
  write_release("other-arch", "{\"target\": {\"fallback\": [\"cpu\"]}, \"models\": {\"m\": {" IO ", \"artifacts\": "
                "{\"cpu\": {\"file\": \"a.bin\", \"sha256\": \"00\", \"format\": \"iree-vmfb\", \"entry\": "
                "\"main\", \"requires\": {\"arch\": \"" OTHER_ARCH "\"}}}}}}", "x");
  CHECK_STATUS(open_in("other-arch", "m", NULL, &m), MODELYARD_INCOMPATIBLE,
               "built for " OTHER_ARCH ", this machine is " THIS_ARCH, "modelyard_open(only another machine's artifact)");
  write_release("npu", "{\"target\": {\"fallback\": [\"npu\"]}, \"models\": {\"m\": {" IO ", \"artifacts\": "
                "{\"npu\": {\"file\": \"a.bin\", \"sha256\": \"00\", \"format\": \"rknn\", \"entry\": \"main\", "
                "\"requires\": {\"npu\": {\"target_platform\": \"rk3588\"}}}}}}}", "x");
  modelyard_default_options(&o);
  o.abi = "npu";
  CHECK_STATUS(open_in("npu", "m", &o, &m), MODELYARD_UNAVAILABLE, "this runtime has no RKNN backend",
               "modelyard_open(abi forced to an NPU artifact)");
  CHECK_STATUS(open_in("npu", "m", NULL, &m), MODELYARD_INCOMPATIBLE, "passed over npu: this runtime has no RKNN",
               "modelyard_open(nothing but an NPU artifact)");
}

/* ------------------------------------------------------------------------------ a model */
static void test_null_handle(void) {
  modelyard_tensor_info_t info;
  modelyard_timing_t timing;
  float x = 0;
  modelyard_close(NULL);
  CHECK(strcmp(modelyard_explain(NULL), "") == 0 && strcmp(modelyard_abi(NULL), "") == 0 &&
        strcmp(modelyard_backend(NULL), "") == 0, "explain/abi/backend of NULL are \"\"");
  CHECK(modelyard_input_count(NULL) == 0 && modelyard_output_count(NULL) == 0, "counts of NULL are 0");
  CHECK_STATUS(modelyard_input_info(NULL, 0, &info), MODELYARD_INVALID_ARGUMENT, "NULL argument", "modelyard_input_info(NULL)");
  CHECK_STATUS(modelyard_output_info(NULL, 0, &info), MODELYARD_INVALID_ARGUMENT, "NULL argument", "modelyard_output_info(NULL)");
  CHECK_STATUS(modelyard_set_input(NULL, 0, &x, sizeof(x)), MODELYARD_INVALID_ARGUMENT, "NULL argument", "modelyard_set_input(NULL)");
  CHECK_STATUS(modelyard_run(NULL), MODELYARD_INVALID_ARGUMENT, "NULL model", "modelyard_run(NULL)");
  CHECK_STATUS(modelyard_get_output(NULL, 0, &x, sizeof(x)), MODELYARD_INVALID_ARGUMENT, "NULL argument", "modelyard_get_output(NULL)");
  CHECK_STATUS(modelyard_last_timing(NULL, &timing), MODELYARD_INVALID_ARGUMENT, "NULL argument", "modelyard_last_timing(NULL)");
}

typedef struct {
  modelyard_model_t* shared;    /* a handle of all the threads, or NULL: open one */
  const char* release;
  const char* model;
  const char* abi;
  const void* input;
  size_t in_size;
  const void* want;             /* the single-thread output of this input */
  const void* other;            /* on a shared handle: that of the other threads' input, or NULL */
  size_t out_size;
  int iterations, bad;          /* bad: runs whose output differed or that failed */
  char error[512];
} worker_t;

static void* worker(void* arg) {
  worker_t* w = (worker_t*)arg;
  modelyard_model_t* m = w->shared;
  modelyard_options_t o;
  void* out = malloc(w->out_size);
  int i;
  modelyard_default_options(&o);
  o.abi = w->abi;
  if (!m && modelyard_open(w->release, w->model, &o, &m) != MODELYARD_OK) {
    snprintf(w->error, sizeof(w->error), "open: %s", modelyard_last_error());
    w->bad = w->iterations;
    free(out);
    return NULL;
  }
  for (i = 0; i < w->iterations; i++) {
    if (modelyard_set_input(m, 0, w->input, w->in_size) != MODELYARD_OK || modelyard_run(m) != MODELYARD_OK ||
        modelyard_get_output(m, 0, out, w->out_size) != MODELYARD_OK) {
      snprintf(w->error, sizeof(w->error), "%s", modelyard_last_error());
      w->bad++;
    } else if (memcmp(out, w->want, w->out_size) != 0 && !(w->other && memcmp(out, w->other, w->out_size) == 0)) {
      w->bad++;  /* neither input's output: a torn buffer */
    }
  }
  if (!w->shared) modelyard_close(m);
  free(out);
  return NULL;
}

static void test_threads(modelyard_model_t* m, const char* release, const char* model, const char* abi,
                         const void* input, size_t in_size, const void* want, size_t out_size) {
  enum { N = 4 };
  pthread_t threads[N];
  worker_t w[N];
  int k, bad = 0, started = 1;
  /* 1000 runs per thread: without the handle's mutex, the TVM artifact's VM broke in 4 of 4
   * tries on x86_64 (0.5 s with it); fewer under qemu (MODELYARD_TEST_THREAD_RUNS) */
  const int ITERATIONS = getenv("MODELYARD_TEST_THREAD_RUNS") ? atoi(getenv("MODELYARD_TEST_THREAD_RUNS")) : 1000;
  const char* before;
  /* the input negated (float32, checked above) and its output, single-threaded */
  float* negated = (float*)malloc(in_size);
  void* want_negated = malloc(out_size);
  for (k = 0; k < (int)(in_size / sizeof(float)); k++) negated[k] = -((const float*)input)[k];
  CHECK(modelyard_set_input(m, 0, negated, in_size) == MODELYARD_OK && modelyard_run(m) == MODELYARD_OK &&
        modelyard_get_output(m, 0, want_negated, out_size) == MODELYARD_OK && memcmp(want, want_negated, out_size) != 0,
        "the negated input gives another output");
  /* one handle, N threads, no lock of the caller's, half of them setting the input, half its
   * negation: calls interleave, but each is atomic, so every output read is one of the two
   * single-thread outputs, never a mix (a run on a half-copied input, a half-copied output) */
  for (k = 0; k < N; k++) {
    memset(&w[k], 0, sizeof(w[k]));
    w[k].shared = m; w[k].input = k % 2 ? (const void*)negated : input; w[k].in_size = in_size;
    w[k].want = k % 2 ? want_negated : want; w[k].other = k % 2 ? want : want_negated;
    w[k].out_size = out_size; w[k].iterations = ITERATIONS;
    started &= pthread_create(&threads[k], NULL, worker, &w[k]) == 0;
  }
  for (k = 0; k < N; k++) { pthread_join(threads[k], NULL); bad += w[k].bad; }
  CHECK(started && bad == 0, "%d threads x %d set/run/get on one handle: %d torn or failed (%s)", N,
        ITERATIONS, bad, w[0].error);
  free(negated);
  free(want_negated);
  /* one handle per thread, opened at the same time (IREE's process-wide flags under a lock) */
  bad = 0;
  for (k = 0; k < 2; k++) {
    memset(&w[k], 0, sizeof(w[k]));
    w[k].release = release; w[k].model = model; w[k].abi = abi; w[k].input = input; w[k].in_size = in_size;
    w[k].want = want; w[k].out_size = out_size; w[k].iterations = 6;
    started &= pthread_create(&threads[k], NULL, worker, &w[k]) == 0;
  }
  for (k = 0; k < 2; k++) { pthread_join(threads[k], NULL); bad += w[k].bad; }
  CHECK(started && bad == 0, "2 threads, each opening its own handle and running it 6 times: %d bad (%s)",
        bad, w[0].error[0] ? w[0].error : w[1].error);
  /* another thread's failure leaves this thread's message alone */
  before = modelyard_last_error();
  {
    char copy[256];
    pthread_t t;
    snprintf(copy, sizeof(copy), "%s", before);
    memset(&w[0], 0, sizeof(w[0]));
    w[0].release = "/nonexistent"; w[0].model = model; w[0].iterations = 1; w[0].out_size = 1;
    pthread_create(&t, NULL, worker, &w[0]);
    pthread_join(t, NULL);
    CHECK(strstr(w[0].error, "cannot read /nonexistent") && strcmp(modelyard_last_error(), copy) == 0,
          "modelyard_last_error is per thread (the other thread's: \"%s\")", w[0].error);
  }
}

static int test_model(const char* release, const char* model, const char* abi, const char* input_path,
                      const char* output_path) {
  modelyard_model_t* m = NULL;
  modelyard_options_t o;
  modelyard_tensor_info_t in, out, again;
  modelyard_timing_t timing;
  size_t in_size = 0;
  void* input = read_all(input_path, &in_size);
  void *output, *second;
  const char* name;
  modelyard_status_t st;
  if (!input) {
    printf("not ok - cannot read %s\n", input_path);
    return 1;
  }
  /* NULL options: the fallback order's choice */
  st = modelyard_open(release, model, NULL, &m);
  CHECK(st == MODELYARD_OK && strncmp(modelyard_explain(m), "chose ", 6) == 0, "modelyard_open(options NULL): %s",
        st == MODELYARD_OK ? modelyard_abi(m) : modelyard_last_error());
  modelyard_close(m);
  modelyard_default_options(&o);
  o.abi = abi;
  st = modelyard_open(release, model, &o, &m);
  CHECK(st == MODELYARD_OK && m != NULL, "modelyard_open(abi %s): %s", abi, modelyard_status_name(st));
  if (st != MODELYARD_OK) {
    printf("# %s\n", modelyard_last_error());
    free(input);
    return 1;
  }
  CHECK(modelyard_last_error()[0] == 0, "a successful modelyard_open clears the thread's last error");
  CHECK(strcmp(modelyard_abi(m), abi) == 0, "modelyard_abi: %s", modelyard_abi(m));
  CHECK(strcmp(modelyard_backend(m), strstr(abi, "-tvm") ? "tvm" : "iree") == 0, "modelyard_backend: %s",
        modelyard_backend(m));
  CHECK(strncmp(modelyard_explain(m), "chose ", 6) == 0 && strstr(modelyard_explain(m), "[forced]"),
        "modelyard_explain: %.60s...", modelyard_explain(m));
  CHECK(modelyard_input_count(m) == 1 && modelyard_output_count(m) == 1, "one input, one output");
  CHECK(modelyard_input_info(m, 0, &in) == MODELYARD_OK && in.byte_size == in_size && in.rank >= 1 &&
        in.dtype == MODELYARD_FLOAT32 && strcmp(in.dtype_name, "float32") == 0,
        "modelyard_input_info: %s %s rank %d, %zu bytes", in.name, in.dtype_name, in.rank, in.byte_size);
  CHECK(modelyard_output_info(m, 0, &out) == MODELYARD_OK && out.byte_size > 0, "modelyard_output_info: %s %zu bytes",
        out.name, out.byte_size);
  CHECK_STATUS(modelyard_input_info(m, 1, &again), MODELYARD_INVALID_ARGUMENT, "the model has 1", "modelyard_input_info(index 1)");
  CHECK_STATUS(modelyard_output_info(m, 7, &again), MODELYARD_INVALID_ARGUMENT, "the model has 1", "modelyard_output_info(index 7)");
  CHECK_STATUS(modelyard_input_info(m, 0, NULL), MODELYARD_INVALID_ARGUMENT, "NULL argument", "modelyard_input_info(NULL info)");
  CHECK_STATUS(modelyard_output_info(m, 0, NULL), MODELYARD_INVALID_ARGUMENT, "NULL argument", "modelyard_output_info(NULL info)");
  name = in.name;
  output = calloc(1, out.byte_size);
  second = calloc(1, out.byte_size);

  CHECK_STATUS(modelyard_get_output(m, 0, output, out.byte_size), MODELYARD_INVALID_ARGUMENT,
               "no successful modelyard_run yet", "modelyard_get_output before any run");
  CHECK(modelyard_last_timing(m, &timing) == MODELYARD_OK && timing.invoke_ns == 0, "modelyard_last_timing before a run: zeros");
  CHECK_STATUS(modelyard_last_timing(m, NULL), MODELYARD_INVALID_ARGUMENT, "NULL argument", "modelyard_last_timing(NULL out)");
  CHECK_STATUS(modelyard_set_input(m, 0, NULL, in_size), MODELYARD_INVALID_ARGUMENT, "NULL argument", "modelyard_set_input(NULL data)");
  CHECK_STATUS(modelyard_set_input(m, 1, input, in_size), MODELYARD_INVALID_ARGUMENT, "the model has 1 inputs",
               "modelyard_set_input(index 1)");
  CHECK_STATUS(modelyard_set_input(m, 0, input, in_size - 4), MODELYARD_INVALID_ARGUMENT, "expected",
               "modelyard_set_input(4 bytes short)");
  CHECK(modelyard_set_input(m, 0, input, in_size) == MODELYARD_OK, "modelyard_set_input");
  st = modelyard_run(m);
  CHECK(st == MODELYARD_OK, "modelyard_run: %s %s", modelyard_status_name(st), st ? modelyard_last_error() : "");
  CHECK(modelyard_last_timing(m, &timing) == MODELYARD_OK && timing.invoke_ns > 0,
        "modelyard_last_timing: copy in %llu ns, invoke %llu ns, copy out %llu ns",
        (unsigned long long)timing.copy_in_ns, (unsigned long long)timing.invoke_ns,
        (unsigned long long)timing.copy_out_ns);
  CHECK_STATUS(modelyard_get_output(m, 0, NULL, out.byte_size), MODELYARD_INVALID_ARGUMENT, "NULL argument",
               "modelyard_get_output(NULL data)");
  CHECK_STATUS(modelyard_get_output(m, 1, output, out.byte_size), MODELYARD_INVALID_ARGUMENT, "the model has 1 outputs",
               "modelyard_get_output(index 1)");
  CHECK_STATUS(modelyard_get_output(m, 0, output, out.byte_size + 4), MODELYARD_INVALID_ARGUMENT, "got room for",
               "modelyard_get_output(4 bytes too many)");
  CHECK(modelyard_get_output(m, 0, output, out.byte_size) == MODELYARD_OK, "modelyard_get_output");
  CHECK(write_all(output_path, output, out.byte_size), "the output written to %s", output_path);
  CHECK(modelyard_run(m) == MODELYARD_OK && modelyard_get_output(m, 0, second, out.byte_size) == MODELYARD_OK &&
        memcmp(output, second, out.byte_size) == 0, "a second run gives the same bytes");
  CHECK(modelyard_input_info(m, 0, &again) == MODELYARD_OK && again.name == name && strcmp(name, in.name) == 0,
        "a tensor name stays the same pointer while the model is open");

  test_threads(m, release, model, abi, input, in_size, output, out.byte_size);
  modelyard_close(m);
  free(output);
  free(second);
  free(input);
  return 0;
}

int main(int argc, char** argv) {
  char* dir;
  if (argc != 6) {
    fprintf(stderr, "usage: %s RELEASE MODEL ABI INPUT OUTPUT\n", argv[0]);
    return 2;
  }
  snprintf(scratch, sizeof(scratch), "%s/modelyard-test-api-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  dir = mkdtemp(scratch);
  if (!dir) {
    perror("mkdtemp");
    return 2;
  }
  test_library();
  test_options();
  test_null_handle();
  test_open_errors(argv[1], argv[2]);
  test_model(argv[1], argv[2], argv[3], argv[4], argv[5]);
  remove_scratch();
  printf("%d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}

/* modelyard-run: open a model of an unpacked release, check it against the release's golden test
 * vectors, time it. Usage:
 *   modelyard-run <release-dir> <model> [--check] [--bench [N]] [--abi NAME]
 *                 [--allow-software-vulkan] [--local-sync | --threads N] [--json]
 * --json: --bench prints one JSON object (every call's times, in ms) instead of the percentiles.
 * Exit status: 0 fine (with --check: every output within the recorded tolerance), 1 a check
 * failed, 2 bad usage, 3 the runtime returned an error (its status and message on stderr). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cJSON.h"
#include "modelyard.h"

static int usage(void) {
  fprintf(stderr, "usage: modelyard-run <release-dir> <model> [--check] [--bench [N]] [--abi NAME]\n"
                  "                     [--allow-software-vulkan] [--local-sync | --threads N] [--json]\n");
  return 2;
}

static int runtime_error(modelyard_status_t status) {
  fprintf(stderr, "modelyard-run: error %s: %s\n", modelyard_status_name(status), modelyard_last_error());
  return 3;
}

static void* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  char* data;
  long n;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  data = (char*)malloc((size_t)n + 1);
  if (data && fread(data, 1, (size_t)n, f) != (size_t)n) { free(data); data = NULL; }
  fclose(f);
  if (data) { data[n] = 0; *size = (size_t)n; }
  return data;
}

/* ------------------------------------------------------------------------------ .npy */
static const char* npy_descr(modelyard_dtype_t d) {
  switch (d) {
    case MODELYARD_FLOAT32: return "<f4"; case MODELYARD_FLOAT16: return "<f2";
    case MODELYARD_FLOAT64: return "<f8"; case MODELYARD_INT8: return "|i1";
    case MODELYARD_UINT8: return "|u1"; case MODELYARD_INT16: return "<i2";
    case MODELYARD_UINT16: return "<u2"; case MODELYARD_INT32: return "<i4";
    case MODELYARD_UINT32: return "<u4"; case MODELYARD_INT64: return "<i8";
    case MODELYARD_UINT64: return "<u8"; case MODELYARD_BOOL: return "|b1";
  }
  return "?";
}

/* The data of a version 1/2 .npy holding exactly `info` (dtype and byte size), else NULL + why. */
static const void* npy_data(const char* bytes, size_t size, const modelyard_tensor_info_t* info,
                            char* why, size_t why_size) {
  size_t header_len, offset;
  char descr[16];
  const char* p;
  if (size < 12 || memcmp(bytes, "\x93NUMPY", 6) != 0) { snprintf(why, why_size, "not a .npy file"); return NULL; }
  if (bytes[6] == 1) { header_len = (unsigned char)bytes[8] | (unsigned char)bytes[9] << 8; offset = 10; }
  else { header_len = (unsigned char)bytes[8] | (unsigned char)bytes[9] << 8 | (size_t)(unsigned char)bytes[10] << 16; offset = 12; }
  p = strstr(bytes + offset, "'descr': '");
  if (!p || sscanf(p + 10, "%15[^']", descr) != 1) { snprintf(why, why_size, "no descr in the .npy header"); return NULL; }
  if (strcmp(descr, npy_descr(info->dtype)) != 0 && !(descr[1] == npy_descr(info->dtype)[1] &&
                                                        descr[2] == npy_descr(info->dtype)[2])) {
    snprintf(why, why_size, "holds %s, the model's %s is %s", descr, info->name, info->dtype_name);
    return NULL;
  }
  if (strstr(bytes + offset, "'fortran_order': True")) { snprintf(why, why_size, "Fortran order"); return NULL; }
  offset += header_len;
  if (size - offset != info->byte_size) {
    snprintf(why, why_size, "holds %zu bytes, the model's %s takes %zu", size - offset, info->name, info->byte_size);
    return NULL;
  }
  return bytes + offset;
}

static double half_to_double(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return (h & 0x8000) ? -v : v;
}

static double element(const void* data, modelyard_dtype_t d, size_t i) {
  switch (d) {
    case MODELYARD_FLOAT32: return ((const float*)data)[i];
    case MODELYARD_FLOAT16: return half_to_double(((const uint16_t*)data)[i]);
    case MODELYARD_FLOAT64: return ((const double*)data)[i];
    case MODELYARD_INT8: return ((const int8_t*)data)[i];
    case MODELYARD_UINT8: case MODELYARD_BOOL: return ((const uint8_t*)data)[i];
    case MODELYARD_INT16: return ((const int16_t*)data)[i];
    case MODELYARD_UINT16: return ((const uint16_t*)data)[i];
    case MODELYARD_INT32: return ((const int32_t*)data)[i];
    case MODELYARD_UINT32: return ((const uint32_t*)data)[i];
    case MODELYARD_INT64: return (double)((const int64_t*)data)[i];
    case MODELYARD_UINT64: return (double)((const uint64_t*)data)[i];
  }
  return NAN;
}

static size_t elem_size(modelyard_dtype_t d) {
  switch (d) {
    case MODELYARD_FLOAT16: case MODELYARD_INT16: case MODELYARD_UINT16: return 2;
    case MODELYARD_FLOAT32: case MODELYARD_INT32: case MODELYARD_UINT32: return 4;
    case MODELYARD_FLOAT64: case MODELYARD_INT64: case MODELYARD_UINT64: return 8;
    default: return 1;
  }
}

/* ------------------------------------------------------------------------------ --check */
static double tol(const cJSON* tolerance, const char* key, double fallback) {
  const cJSON* v = cJSON_GetObjectItemCaseSensitive(tolerance, key);
  return cJSON_IsNumber(v) ? v->valuedouble : fallback;
}

static int check(modelyard_model_t* m, const char* root, const char* name) {
  char path[4096];
  size_t size = 0, i, k;
  char* text;
  cJSON *doc, *model, *vectors, *tolerance;
  int failed = 0;
  modelyard_status_t st;
  snprintf(path, sizeof(path), "%s/release.json", root);
  text = (char*)read_file(path, &size);
  doc = text ? cJSON_Parse(text) : NULL;
  free(text);
  model = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "models"), name);
  vectors = cJSON_GetObjectItemCaseSensitive(model, "test_vectors");
  tolerance = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(
      cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(model, "artifacts"), modelyard_abi(m)),
      "validation"), "tolerance");
  if (!vectors || !tolerance) {
    fprintf(stderr, "modelyard-run: release.json has no test_vectors or no tolerance for %s/%s\n", name,
            modelyard_abi(m));
    cJSON_Delete(doc);
    return 1;
  }
  for (i = 0; i < modelyard_input_count(m); i++) {
    modelyard_tensor_info_t info;
    const cJSON* file = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(vectors, "inputs"), (int)i);
    char* bytes;
    const void* data;
    char why[512];
    modelyard_input_info(m, i, &info);
    snprintf(path, sizeof(path), "%s/%s", root, cJSON_IsString(file) ? file->valuestring : "?");
    bytes = (char*)read_file(path, &size);
    data = bytes ? npy_data(bytes, size, &info, why, sizeof(why)) : NULL;
    if (!data) {
      fprintf(stderr, "modelyard-run: test vector %s: %s\n", path, bytes ? why : "cannot read it");
      free(bytes);
      cJSON_Delete(doc);
      return 1;
    }
    st = modelyard_set_input(m, i, data, info.byte_size);
    free(bytes);
    if (st != MODELYARD_OK) { cJSON_Delete(doc); return runtime_error(st); }
  }
  if ((st = modelyard_run(m)) != MODELYARD_OK) { cJSON_Delete(doc); return runtime_error(st); }
  for (k = 0; k < modelyard_output_count(m); k++) {
    modelyard_tensor_info_t info;
    const cJSON* file = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(vectors, "outputs"), (int)k);
    char* bytes;
    const void* want;
    void* got;
    char why[512];
    double max_abs = 0, sum_abs = 0, dot = 0, na = 0, nb = 0, cosine = 1, peak = 0, sum_golden = 0;
    size_t n, nonfinite = 0;
    int cosine_used;
    int ok;
    modelyard_output_info(m, k, &info);
    snprintf(path, sizeof(path), "%s/%s", root, cJSON_IsString(file) ? file->valuestring : "?");
    bytes = (char*)read_file(path, &size);
    want = bytes ? npy_data(bytes, size, &info, why, sizeof(why)) : NULL;
    if (!want) {
      fprintf(stderr, "modelyard-run: test vector %s: %s\n", path, bytes ? why : "cannot read it");
      free(bytes);
      cJSON_Delete(doc);
      return 1;
    }
    got = malloc(info.byte_size + 1);
    modelyard_get_output(m, k, got, info.byte_size);
    n = info.byte_size / elem_size(info.dtype);
    for (i = 0; i < n; i++) {
      double a = element(got, info.dtype, i), b = element(want, info.dtype, i), d = fabs(a - b);
      if (!isfinite(a) || !isfinite(b)) { nonfinite++; continue; }
      if (d > max_abs) max_abs = d;
      sum_abs += d;
      dot += a * b; na += a * a; nb += b * b;
      if (fabs(b) > peak) peak = fabs(b);
      sum_golden += fabs(b);
    }
    /* the rules of pipeline/core/numerics.py: cosine judges only a golden that stands out of
     * the absolute tolerance; a non-finite value on either side fails */
    cosine_used = n > 0 && (peak > tol(tolerance, "max_abs", INFINITY) ||
                            sum_golden / (double)n > tol(tolerance, "mean_abs", INFINITY));
    if (na > 0 && nb > 0) cosine = dot / (sqrt(na) * sqrt(nb));
    else if (na != nb) cosine = 0;
    if (info.dtype == MODELYARD_BOOL) {  /* as validation compares them: mismatches counted */
      size_t mismatches = 0;
      for (i = 0; i < n; i++) mismatches += (element(got, info.dtype, i) != 0) != (element(want, info.dtype, i) != 0);
      ok = (double)mismatches <= tol(tolerance, "bool_mismatch", 0);
      printf("check %s: %zu of %zu booleans differ (tol %.0f) %s\n", info.name, mismatches, n,
             tol(tolerance, "bool_mismatch", 0), ok ? "PASS" : "FAIL");
    } else if (info.dtype != MODELYARD_FLOAT32 && info.dtype != MODELYARD_FLOAT16 &&
               info.dtype != MODELYARD_FLOAT64) {  /* integers: exact, or within integer_steps */
      ok = max_abs <= tol(tolerance, "integer_steps", 0);
      printf("check %s: %s, max %.0f steps off (tol %.0f) %s\n", info.name, info.dtype_name, max_abs,
             tol(tolerance, "integer_steps", 0), ok ? "PASS" : "FAIL");
    } else {
      ok = nonfinite == 0 && max_abs <= tol(tolerance, "max_abs", INFINITY) &&
           (n ? sum_abs / (double)n : 0) <= tol(tolerance, "mean_abs", INFINITY) &&
           (!cosine_used || cosine >= tol(tolerance, "cosine", -1));
      printf("check %s: max_abs %.3g (tol %.3g) mean_abs %.3g (tol %.3g) ", info.name, max_abs,
             tol(tolerance, "max_abs", INFINITY), n ? sum_abs / (double)n : 0, tol(tolerance, "mean_abs", INFINITY));
      if (cosine_used) printf("cosine %.9f (tol %.9f)", cosine, tol(tolerance, "cosine", -1));
      else printf("cosine not used (golden is zero at the tolerance's resolution)");
      if (nonfinite) printf(" %zu non-finite values", nonfinite);
      printf(" %s\n", ok ? "PASS" : "FAIL");
    }
    failed |= !ok;
    free(got);
    free(bytes);
  }
  cJSON_Delete(doc);
  printf("check: %s\n", failed ? "FAILED" : "all outputs within the recorded tolerance");
  return failed;
}

/* ------------------------------------------------------------------------------ --bench */
static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double pct(double* v, size_t n, double p) {
  size_t i = (size_t)ceil(p / 100.0 * (double)n);
  return v[i ? i - 1 : 0];
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void json_series(const char* key, const double* v, int n, int last) {
  int i;
  printf("\"%s\": [", key);
  for (i = 0; i < n; i++) printf("%s%.6f", i ? ", " : "", v[i]);
  printf("]%s", last ? "" : ", ");
}

static int bench(modelyard_model_t* m, int window, int json) {
  size_t ni = modelyard_input_count(m), no = modelyard_output_count(m), i;
  void** in = (void**)calloc(ni, sizeof(void*));
  void** out = (void**)calloc(no, sizeof(void*));
  double *total = (double*)calloc((size_t)window, sizeof(double)), *invoke = (double*)calloc((size_t)window, sizeof(double)),
         *boundary = (double*)calloc((size_t)window, sizeof(double));
  modelyard_tensor_info_t info;
  struct rusage ru;
  int r;
  for (i = 0; i < ni; i++) { modelyard_input_info(m, i, &info); in[i] = calloc(1, info.byte_size + 1); }
  for (i = 0; i < no; i++) { modelyard_output_info(m, i, &info); out[i] = calloc(1, info.byte_size + 1); }
  for (r = -3; r < window; r++) {  /* 3 warm-up calls */
    modelyard_timing_t t;
    uint64_t t0 = now_ns(), t1;
    modelyard_status_t st = MODELYARD_OK;
    for (i = 0; i < ni && st == MODELYARD_OK; i++) {
      modelyard_input_info(m, i, &info);
      st = modelyard_set_input(m, i, in[i], info.byte_size);
    }
    if (st == MODELYARD_OK) st = modelyard_run(m);
    for (i = 0; i < no && st == MODELYARD_OK; i++) {
      modelyard_output_info(m, i, &info);
      st = modelyard_get_output(m, i, out[i], info.byte_size);
    }
    t1 = now_ns();
    if (st != MODELYARD_OK) return runtime_error(st);
    if (r < 0) continue;
    modelyard_last_timing(m, &t);
    total[r] = (double)(t1 - t0) / 1e6;
    invoke[r] = (double)t.invoke_ns / 1e6;
    boundary[r] = total[r] - invoke[r];
  }
  getrusage(RUSAGE_SELF, &ru);
  if (json) {  /* every call, in call order: for bench/c_runtime.py */
    printf("{\"abi\": \"%s\", \"max_rss_kib\": %ld, ", modelyard_abi(m), ru.ru_maxrss);
    json_series("total_ms", total, window, 0);
    json_series("invoke_ms", invoke, window, 0);
    json_series("boundary_ms", boundary, window, 1);
    printf("}\n");
  } else {
    qsort(total, (size_t)window, sizeof(double), by_value);
    qsort(invoke, (size_t)window, sizeof(double), by_value);
    qsort(boundary, (size_t)window, sizeof(double), by_value);
    printf("bench %s, %d calls after 3 warm-up:\n", modelyard_abi(m), window);
    printf("  per call (set inputs + run + get outputs): p50 %.4f ms  p90 %.4f ms  p99 %.4f ms\n",
           pct(total, window, 50), pct(total, window, 90), pct(total, window, 99));
    printf("  invoke (inside the runtime):               p50 %.4f ms  p90 %.4f ms  p99 %.4f ms\n",
           pct(invoke, window, 50), pct(invoke, window, 90), pct(invoke, window, 99));
    printf("  boundary copies (the rest):                p50 %.4f ms  p90 %.4f ms  p99 %.4f ms\n",
           pct(boundary, window, 50), pct(boundary, window, 90), pct(boundary, window, 99));
    printf("  peak memory (max RSS of this process): %ld KiB\n", ru.ru_maxrss);
  }
  for (i = 0; i < ni; i++) free(in[i]);
  for (i = 0; i < no; i++) free(out[i]);
  free(in); free(out); free(total); free(invoke); free(boundary);
  return 0;
}

int main(int argc, char** argv) {
  modelyard_options_t options;
  modelyard_model_t* m;
  modelyard_status_t st;
  int do_check = 0, window = 0, json = 0, i, rc = 0;
  size_t k;
  if (argc < 3) return usage();
  modelyard_default_options(&options);
  for (i = 3; i < argc; i++) {
    if (strcmp(argv[i], "--check") == 0) do_check = 1;
    else if (strcmp(argv[i], "--bench") == 0) {
      window = 50;
      if (i + 1 < argc && argv[i + 1][0] != '-') window = atoi(argv[++i]);
      if (window < 1) return usage();
    } else if (strcmp(argv[i], "--abi") == 0 && i + 1 < argc) options.abi = argv[++i];
    else if (strcmp(argv[i], "--allow-software-vulkan") == 0) options.allow_software_vulkan = 1;
    else if (strcmp(argv[i], "--local-sync") == 0) options.cpu_threads = 1;
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
      options.cpu_threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--json") == 0) json = 1;
    else return usage();
  }
  st = modelyard_open(argv[1], argv[2], &options, &m);
  if (st != MODELYARD_OK) return runtime_error(st);
  if (!json) fputs(modelyard_explain(m), stdout);
  for (k = 0; !json && k < modelyard_input_count(m) + modelyard_output_count(m); k++) {
    modelyard_tensor_info_t info;
    int in = k < modelyard_input_count(m), d;
    if (in) modelyard_input_info(m, k, &info);
    else modelyard_output_info(m, k - modelyard_input_count(m), &info);
    printf("%s %s %s [", in ? "input " : "output", info.name, info.dtype_name);
    for (d = 0; d < info.rank; d++) printf("%s%lld", d ? ", " : "", (long long)info.shape[d]);
    printf("]\n");
  }
  if (do_check) rc = check(m, argv[1], argv[2]);
  if (rc == 0 && window) rc = bench(m, window, json);
  modelyard_close(m);
  return rc;
}

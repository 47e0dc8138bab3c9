/* C test of modelyard_nms_boxes (ISO C99): the selection, and its refusals.
 *
 *   test_nms BOXES SCORES NUM_BATCHES NUM_CLASSES NUM_BOXES IOU SCORE|none MAX CENTER OUTPUT
 *
 * BOXES and SCORES hold raw float32 ([batches][boxes][4], [batches][classes][boxes]); the program
 * writes the selected rows (batch, class, box) as raw int64 to OUTPUT, for the caller to compare
 * with onnxruntime's NonMaxSuppression on the same inputs (tests/e2e/test_detector_postprocess.py).
 * It prints one line per check of the refusals ("ok ..." / "not ok ..."); exit status 0 only when
 * every check passed and the selection was written. Needs no release: the function is pure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modelyard.h"

static int failures = 0;

static void check(int cond, const char* what) {
  printf("%s - %s (%s)\n", cond ? "ok" : "not ok", what, modelyard_last_error());
  if (!cond) failures++;
}

static float* read_floats(const char* path, size_t count) {
  FILE* f = fopen(path, "rb");
  float* data = malloc(count * sizeof(float) + 1);
  if (!f || !data || fread(data, sizeof(float), count, f) != count) {
    fprintf(stderr, "cannot read %zu floats from %s\n", count, path);
    exit(2);
  }
  fclose(f);
  return data;
}

int main(int argc, char** argv) {
  modelyard_nms_options_t opt, bad;
  size_t batches, classes, boxes_n, capacity, count = 0;
  float *boxes, *scores;
  int64_t* rows;
  FILE* out;
  if (argc != 11) {
    fprintf(stderr, "usage: test_nms BOXES SCORES B C N IOU SCORE|none MAX CENTER OUTPUT\n");
    return 2;
  }
  batches = strtoul(argv[3], NULL, 10);
  classes = strtoul(argv[4], NULL, 10);
  boxes_n = strtoul(argv[5], NULL, 10);
  boxes = read_floats(argv[1], batches * boxes_n * 4);
  scores = read_floats(argv[2], batches * classes * boxes_n);
  check(modelyard_default_nms_options(&opt) == MODELYARD_OK && opt.struct_size == sizeof(opt),
        "default options");
  opt.iou_threshold = (float)atof(argv[6]);
  opt.use_score_threshold = strcmp(argv[7], "none") != 0;
  opt.score_threshold = opt.use_score_threshold ? (float)atof(argv[7]) : 0.0f;
  opt.max_per_class = strtoul(argv[8], NULL, 10);
  opt.center_point_box = atoi(argv[9]);
  capacity = batches * classes * (opt.max_per_class < boxes_n ? opt.max_per_class : boxes_n);
  rows = malloc((capacity ? capacity : 1) * 3 * sizeof(int64_t));

  /* the refusals: nothing written, the thread's last error says why */
  bad = opt;
  bad.struct_size = 0;
  check(modelyard_nms_boxes(boxes, scores, batches, classes, boxes_n, &bad, rows, capacity, &count)
            == MODELYARD_INVALID_ARGUMENT && strstr(modelyard_last_error(), "struct_size"),
        "options not initialised");
  check(modelyard_nms_options_init(&bad, 3) == MODELYARD_INVALID_ARGUMENT, "unknown struct_size");
  bad = opt;
  bad.iou_threshold = 1.5f;
  check(modelyard_nms_boxes(boxes, scores, batches, classes, boxes_n, &bad, rows, capacity, &count)
            == MODELYARD_INVALID_ARGUMENT && strstr(modelyard_last_error(), "iou_threshold"),
        "iou_threshold outside [0, 1]");
  if (capacity)
    check(modelyard_nms_boxes(boxes, scores, batches, classes, boxes_n, &opt, rows, capacity - 1,
                              &count) == MODELYARD_INVALID_ARGUMENT &&
              strstr(modelyard_last_error(), "capacity") && count == 0,
          "capacity too small, *out_count untouched");
  check(modelyard_nms_boxes(NULL, scores, batches, classes, boxes_n, &opt, rows, capacity, &count)
            == MODELYARD_INVALID_ARGUMENT, "NULL boxes");

  check(modelyard_nms_boxes(boxes, scores, batches, classes, boxes_n, &opt, rows, capacity, &count)
            == MODELYARD_OK, "the selection");
  out = fopen(argv[10], "wb");
  if (!out || fwrite(rows, sizeof(int64_t), count * 3, out) != count * 3) failures++;
  if (out) fclose(out);
  printf("selected %zu\n", count);
  free(boxes); free(scores); free(rows);
  return failures ? 1 : 0;
}

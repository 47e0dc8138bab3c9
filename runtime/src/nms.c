/* modelyard_nms_boxes: ONNX NonMaxSuppression on the host, for a detector whose post-processing
 * was cut off its artifact (docs/postprocess.md). The same selection as onnxruntime's CPU kernel
 * (onnxruntime/core/providers/cpu/object_detection/non_max_suppression.cc): per batch and class,
 * the boxes scoring above score_threshold in order of falling score (a tie: the lower index
 * first), each kept unless its IoU with one already kept is above iou_threshold, until
 * max_per_class are kept; the IoU in float, from the corners (min/max of each axis), 0 for a box
 * of no area. Pure: no state, any thread (modelyard.h). C11. */
#include <stdlib.h>

#include "internal.h"

typedef struct {
  float score;
  size_t index;
} scored_t;

static int by_score(const void* a, const void* b) {
  const scored_t* x = a;
  const scored_t* y = b;
  if (x->score != y->score) return x->score < y->score ? 1 : -1;
  return x->index < y->index ? -1 : (x->index > y->index);
}

/* corners y1 x1 y2 x2 (either corner first) of box b, as onnxruntime's MaxMin reads them */
static void corners(const float* b, int center_point_box, float out[4]) {
  if (center_point_box) {  /* [x_center, y_center, width, height] */
    float hw = b[2] / 2.0f, hh = b[3] / 2.0f;
    out[0] = b[1] - hh; out[1] = b[0] - hw; out[2] = b[1] + hh; out[3] = b[0] + hw;
  } else {
    out[0] = b[0] < b[2] ? b[0] : b[2]; out[2] = b[0] < b[2] ? b[2] : b[0];
    out[1] = b[1] < b[3] ? b[1] : b[3]; out[3] = b[1] < b[3] ? b[3] : b[1];
  }
}

static int suppresses(const float a[4], const float b[4], float iou_threshold) {
  float y_min = a[0] > b[0] ? a[0] : b[0], y_max = a[2] < b[2] ? a[2] : b[2];
  float x_min = a[1] > b[1] ? a[1] : b[1], x_max = a[3] < b[3] ? a[3] : b[3];
  float inter, area_a, area_b, uni;
  if (x_max <= x_min || y_max <= y_min) return 0;
  inter = (x_max - x_min) * (y_max - y_min);
  area_a = (a[2] - a[0]) * (a[3] - a[1]);
  area_b = (b[2] - b[0]) * (b[3] - b[1]);
  if (area_a <= 0.0f || area_b <= 0.0f) return 0;
  uni = area_a + area_b - inter;
  if (uni <= 0.0f) return 0;
  return inter / uni > iou_threshold;
}

modelyard_status_t modelyard_nms_boxes(const float* boxes, const float* scores,
                                       size_t num_batches, size_t num_classes, size_t num_boxes,
                                       const modelyard_nms_options_t* options,
                                       int64_t* out_selected, size_t capacity,
                                       size_t* out_count) {
  scored_t* order;
  size_t* kept;
  float* box_corners;
  size_t b, c, k, j, n = 0, most;
  if (!boxes || !scores || !options || !out_count || (capacity && !out_selected))
    return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_nms_boxes: a NULL argument");
  if (options->struct_size != sizeof(modelyard_nms_options_t))
    return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_nms_boxes: options struct_size is %zu, "
                   "this library knows %zu (initialise it with modelyard_default_nms_options)",
                   options->struct_size, sizeof(modelyard_nms_options_t));
  if (!(options->iou_threshold >= 0.0f && options->iou_threshold <= 1.0f))
    return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_nms_boxes: iou_threshold %g is not in "
                   "[0, 1]", (double)options->iou_threshold);
  most = options->max_per_class < num_boxes ? options->max_per_class : num_boxes;
  if (capacity < num_batches * num_classes * most)
    return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_nms_boxes: capacity %zu rows, the "
                   "selection may need %zu (num_batches x num_classes x min(max_per_class, "
                   "num_boxes))", capacity, num_batches * num_classes * most);
  order = malloc((num_boxes ? num_boxes : 1) * sizeof(*order));
  kept = malloc((num_boxes ? num_boxes : 1) * sizeof(*kept));
  box_corners = malloc((num_boxes ? num_boxes : 1) * 4 * sizeof(*box_corners));
  if (!order || !kept || !box_corners) {
    free(order); free(kept); free(box_corners);
    return my_fail(MODELYARD_OUT_OF_MEMORY, "modelyard_nms_boxes: no memory for %zu boxes",
                   num_boxes);
  }
  for (b = 0; b < num_batches; b++) {
    for (k = 0; k < num_boxes; k++)
      corners(boxes + (b * num_boxes + k) * 4, options->center_point_box, box_corners + k * 4);
    for (c = 0; c < num_classes && most; c++) {
      const float* s = scores + (b * num_classes + c) * num_boxes;
      size_t m = 0, n_kept = 0;
      for (k = 0; k < num_boxes; k++)
        if (!options->use_score_threshold || s[k] > options->score_threshold) {
          order[m].score = s[k];
          order[m++].index = k;
        }
      qsort(order, m, sizeof(*order), by_score);
      for (k = 0; k < m && n_kept < most; k++) {
        const float* box = box_corners + order[k].index * 4;
        int keep = 1;
        for (j = 0; j < n_kept && keep; j++)
          keep = !suppresses(box_corners + kept[j] * 4, box, options->iou_threshold);
        if (!keep) continue;
        kept[n_kept++] = order[k].index;
        out_selected[n * 3] = (int64_t)b;
        out_selected[n * 3 + 1] = (int64_t)c;
        out_selected[n * 3 + 2] = (int64_t)order[k].index;
        n++;
      }
    }
  }
  free(order); free(kept); free(box_corners);
  *out_count = n;
  return MODELYARD_OK;
}

modelyard_status_t modelyard_nms_options_init(modelyard_nms_options_t* options,
                                              size_t struct_size) {
  if (!options || struct_size != sizeof(modelyard_nms_options_t))
    return my_fail(MODELYARD_INVALID_ARGUMENT, "modelyard_nms_options_init: %s",
                   options ? "struct_size is not the size of a modelyard_nms_options_t this "
                             "library knows" : "NULL options");
  options->struct_size = struct_size;
  options->iou_threshold = 0.0f;
  options->score_threshold = 0.0f;
  options->use_score_threshold = 0;
  options->max_per_class = 0;
  options->center_point_box = 0;
  return MODELYARD_OK;
}

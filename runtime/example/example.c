/* The call cadence: open once, describe, set inputs, run, read outputs, close. */
#include <stdio.h>
#include <stdlib.h>

#include "modelyard.h"

int main(int argc, char** argv) {
  modelyard_model_t* model;
  modelyard_tensor_info_t in, out;
  modelyard_status_t status;
  float *input, *output;
  size_t i;
  if (argc != 3) {
    fprintf(stderr, "usage: %s <release-dir> <model>\n", argv[0]);
    return 2;
  }
  status = modelyard_open(argv[1], argv[2], NULL, &model);  /* picks the artifact */
  if (status != MODELYARD_OK) {
    fprintf(stderr, "%s: %s\n", modelyard_status_name(status), modelyard_last_error());
    return 1;
  }
  printf("%s", modelyard_explain(model));  /* which artifact, and why */
  modelyard_input_info(model, 0, &in);
  modelyard_output_info(model, 0, &out);
  input = calloc(1, in.byte_size);  /* your camera frame here (float32 assumed) */
  output = malloc(out.byte_size);
  for (i = 0; i < in.byte_size / sizeof(float); i++) input[i] = (float)(i % 255) / 255.0f;
  if ((status = modelyard_set_input(model, 0, input, in.byte_size)) != MODELYARD_OK ||
      (status = modelyard_run(model)) != MODELYARD_OK ||
      (status = modelyard_get_output(model, 0, output, out.byte_size)) != MODELYARD_OK) {
    fprintf(stderr, "%s: %s\n", modelyard_status_name(status), modelyard_last_error());
  } else {
    printf("%s[0] = %g\n", out.name, output[0]);
  }
  free(input);
  free(output);
  modelyard_close(model);
  return status == MODELYARD_OK ? 0 : 1;
}

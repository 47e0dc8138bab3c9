/* The calling thread's last error (modelyard.h: Errors) and the names of the statuses: shared
 * by every call of the library (modelyard.c, nms.c). C11 (_Thread_local). */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

static _Thread_local char last_error[MY_ERR_SIZE];

modelyard_status_t my_fail(modelyard_status_t status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof(last_error), fmt, ap);
  va_end(ap);
  return status;
}

void my_clear_error(void) { last_error[0] = 0; }

const char* modelyard_last_error(void) { return last_error; }

const char* modelyard_status_name(modelyard_status_t status) {
  static const char* names[] = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "CORRUPT", "INCOMPATIBLE",
                                "UNAVAILABLE", "RUNTIME_ERROR", "OUT_OF_MEMORY"};
  return (unsigned)status < sizeof(names) / sizeof(names[0]) ? names[status] : "UNKNOWN";
}

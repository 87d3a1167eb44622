/* The driver pager's counters (driver_base.h). */
#include <string.h>

#include "driver_base.h"

static clamor_driver_stats st;

void driver_base_reset(void) { memset(&st, 0, sizeof st); }

clamor_driver_stats *driver_stats(void) { return &st; }

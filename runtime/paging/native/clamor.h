/* Internal umbrella header: standard types, then the public API (api.h). */
#ifndef CLAMOR_H
#define CLAMOR_H
#include <stddef.h>
#include <stdint.h>
#include "api.h"
#endif

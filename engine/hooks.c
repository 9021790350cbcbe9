/* engine/hooks.c - the engine's test hooks (hooks.h): none in production. */
#include "engine/hooks.h"

ote__engine_hooks_t ote__engine_hooks;

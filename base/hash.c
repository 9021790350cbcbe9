#include "base/hash.h"

_Thread_local int ote__hash_oom;
